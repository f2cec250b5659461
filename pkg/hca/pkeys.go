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

	"github.com/rdma-dra/rdma-dra-driver/pkg/hca/pkey"
)

// PKey is one entry of a port's partition key table. Value keeps the
// membership bit (0x8000: full member).
type PKey struct {
	Index int
	Value uint16
}

// FullMember is the membership bit of a P_Key.
const FullMember = 0x8000

// PKeys reads the P_Key table of one port (ports/<port>/pkeys/<index>),
// leaving out the empty (0x0000) entries, sorted by index. Discovery does
// not read it: an InfiniBand port has 128 entries, read only when a claim
// needs them. A port without a table (iWARP) has none and no error.
func (d *Discoverer) PKeys(ibdev string, port int) ([]PKey, error) {
	dir := filepath.Join(d.sysfsRoot, "class", "infiniband", ibdev, "ports", strconv.Itoa(port), "pkeys")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		if _, err := os.Stat(filepath.Dir(dir)); err != nil {
			return nil, fmt.Errorf("HCA %s port %d: %w", ibdev, port, err)
		}
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []PKey
	for _, e := range entries {
		i, err := strconv.Atoi(e.Name())
		if err != nil || i < 0 {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := d.readFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		v, err := pkey.Parse(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if v&^FullMember != 0 {
			out = append(out, PKey{Index: i, Value: v})
		}
	}
	slices.SortFunc(out, func(a, b PKey) int { return a.Index - b.Index })
	return out, nil
}

// FindPKey returns the index of want in table: an entry with the same
// partition (the low 15 bits) and, when want asks for full membership,
// the membership bit too. The lowest index wins.
func FindPKey(table []PKey, want uint16) (int, bool) {
	for _, k := range table {
		if k.Value&^FullMember != want&^FullMember {
			continue
		}
		if want&FullMember != 0 && k.Value&FullMember == 0 {
			continue
		}
		return k.Index, true
	}
	return 0, false
}
