package hca

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

func (p *pass) rdmaCM(warns *[]string) *CharDevice {
	path := filepath.Join(p.root, "class", "misc", "rdma_cm", "dev")
	s, err := p.read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	w := warner{warns}
	if err != nil {
		w.add(path, err)
		return nil
	}
	cd, err := p.charDevice("rdma_cm", path, s)
	if err != nil {
		// Every container that gets rdma_cm would get the bad node: leave
		// it out, as when rdma_ucm is not loaded, and say so.
		w.addErr(fmt.Errorf("%w; rdma_cm is left out of the inventory", err))
		return nil
	}
	return &cd
}

// charDevice builds a CharDevice from its sysfs dev file (path, holding
// dev) and looks for its node under the dev root. It fails, naming the file
// at fault, when dev is not a device number the kernel allocates, or when the
// node is there but is not a character device of that number. A node that
// is missing is not an error here (Exists is false), nor is a regular file:
// that is what a simulated node has when it was built without root, and a
// container's node is made from the sysfs number, never copied from /dev.
func (p *pass) charDevice(name, path, dev string) (CharDevice, error) {
	major, minor, err := parseDevNumbers(dev)
	if err != nil {
		return CharDevice{}, fmt.Errorf("%s: %w", path, err)
	}
	cd := CharDevice{Name: name, Path: "/dev/infiniband/" + name, Major: major, Minor: minor}
	node := filepath.Join(p.d.devRoot, "infiniband", name)
	fi, err := os.Stat(node)
	if err != nil {
		return cd, nil
	}
	cd.Exists = true
	switch mode := fi.Mode(); {
	case mode.IsRegular():
	case mode.Type() != fs.ModeDevice|fs.ModeCharDevice:
		return CharDevice{}, fmt.Errorf("%s is not a character device (mode %v)", node, mode)
	default:
		if ma, mi, ok := nodeNumber(fi); ok && (ma != major || mi != minor) {
			return CharDevice{}, fmt.Errorf("%s is character device %d:%d, but %s says %q", node, ma, mi, path, dev)
		}
	}
	return cd, nil
}

// classDevices lists the entries of a class, sorted. The class dir is open
// while the caller reads them, and closed by the caller.
func (p *pass) classDevices(class string) (dir, []string, error) {
	cd := p.rootDir(filepath.Join(p.root, "class", class))
	entries, err := p.names(cd, "")
	if errors.Is(err, fs.ErrNotExist) {
		return cd, nil, nil
	}
	if err != nil {
		return cd, nil, err
	}
	slices.Sort(entries)
	return cd, entries, nil
}

// classDevice opens a class entry, or says it is no device directory (a
// plain file such as abi_version, or a dangling link).
func (p *pass) classDevice(class dir, name string) (dir, bool) {
	d, err := p.openDirErr(class, name)
	if d.fd >= 0 {
		return d, true
	}
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ENOENT) {
		return d, false
	}
	return d, p.isDirIn(class, name) // read by path: errors name the files
}

// uverbsDevices maps ibdev name to its verbs device. A verbs device whose
// dev file is unreadable or impossible, or whose /dev node contradicts it,
// is left out of good; bad then says why, by ibdev, naming the file, to
// become the HCA's UnusableReason.
func (p *pass) uverbsDevices() (good map[string]CharDevice, bad map[string]string, warns []string) {
	w := warner{&warns}
	class, names, err := p.classDevices("infiniband_verbs")
	defer p.closeDir(class)
	if err != nil {
		w.add(class.path, err)
	}
	good, bad = map[string]CharDevice{}, map[string]string{}
	for _, name := range names {
		d, ok := p.classDevice(class, name)
		if !ok {
			continue
		}
		p.uverbsDevice(w, d, name, good, bad)
		p.closeDir(d)
	}
	return good, bad, warns
}

func (p *pass) uverbsDevice(w warner, d dir, name string, good map[string]CharDevice, bad map[string]string) {
	ibdev, ok := p.readAttr(w, d, "ibdev")
	if !ok {
		return
	}
	devPath := d.join("dev")
	dev, err := p.readAt(d, "dev")
	if err != nil {
		bad[ibdev] = fileError(devPath, err)
		return
	}
	cd, err := p.charDevice(name, devPath, dev)
	if err != nil {
		bad[ibdev] = err.Error()
		return
	}
	good[ibdev] = cd
}

// madDevices maps ibdev name to its umad and issm devices, sorted by name.
func (p *pass) madDevices() (map[string][]CharDevice, []string) {
	var warns []string
	w := warner{&warns}
	class, names, err := p.classDevices("infiniband_mad")
	defer p.closeDir(class)
	if err != nil {
		w.add(class.path, err)
	}
	out := map[string][]CharDevice{}
	for _, name := range names {
		d, ok := p.classDevice(class, name)
		if !ok {
			continue
		}
		ibdev, ok1 := p.readAttr(w, d, "ibdev")
		port, ok2 := p.readAttr(w, d, "port")
		dev, ok3 := p.readAttr(w, d, "dev")
		p.closeDir(d)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 {
			w.add(d.join("port"), fmt.Errorf("cannot parse %q: want a port number", port))
			continue
		}
		cd, err := p.charDevice(name, d.join("dev"), dev)
		if err != nil {
			w.addErr(err)
			continue
		}
		cd.Port = n
		out[ibdev] = append(out[ibdev], cd)
	}
	for _, l := range out {
		slices.SortFunc(l, func(a, b CharDevice) int { return strings.Compare(a.Name, b.Name) })
	}
	return out, warns
}
