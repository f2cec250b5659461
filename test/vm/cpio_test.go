package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// readNewc parses a newc archive back: name -> (mode, content).
func readNewc(t *testing.T, b []byte) (map[string]uint32, map[string]string, []string) {
	t.Helper()
	modes, data := map[string]uint32{}, map[string]string{}
	var order []string
	off := 0
	field := func(i int) int {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+6+8*i+8]), 16, 32)
		if err != nil {
			t.Fatalf("header field %d at %d: %v", i, off, err)
		}
		return int(v)
	}
	for {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, b[off:off+6])
		}
		mode, size, nameLen := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+nameLen-1])
		off = (off + 110 + nameLen + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(b) {
				t.Errorf("%d bytes after the trailer", len(b)-off)
			}
			return modes, data, order
		}
		modes[name], data[name] = uint32(mode), string(b[off:off+size])
		order = append(order, name)
		off = (off + size + 3) &^ 3
	}
}

func TestTreeWritesNewc(t *testing.T) {
	src := filepath.Join(t.TempDir(), "busybox")
	if err := os.WriteFile(src, []byte("ELF..."), 0o644); err != nil {
		t.Fatal(err)
	}
	tr := NewTree()
	tr.File("/init", 0o755, []byte("#!/bin/sh\n"))
	tr.Copy("bin/busybox", src, 0o755)
	tr.Symlink("lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
	tr.Dir("proc", 0o555)
	var buf bytes.Buffer
	if _, err := tr.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if buf.Len()%4 != 0 {
		t.Errorf("archive length %d is not a multiple of 4", buf.Len())
	}
	modes, data, order := readNewc(t, buf.Bytes())
	want := map[string]struct {
		mode uint32
		data string
	}{
		"bin":                        {0o40755, ""},
		"bin/busybox":                {0o100755, "ELF..."},
		"init":                       {0o100755, "#!/bin/sh\n"},
		"lib64":                      {0o40755, ""},
		"lib64/ld-linux-x86-64.so.2": {0o120777, "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
		"proc":                       {0o40555, ""},
	}
	if len(modes) != len(want) {
		t.Errorf("entries %v, want %d", order, len(want))
	}
	for name, w := range want {
		if modes[name] != w.mode || data[name] != w.data {
			t.Errorf("%s: mode %o data %q, want %o %q", name, modes[name], data[name], w.mode, w.data)
		}
	}
	if order[0] != "bin" || order[1] != "bin/busybox" {
		t.Errorf("a parent must come before its children: %v", order)
	}
}

func TestTreeMissingSourceNamesIt(t *testing.T) {
	tr := NewTree()
	tr.Copy("usr/bin/rdma", "/nonexistent/rdma", 0o755)
	_, err := tr.WriteTo(&bytes.Buffer{})
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("usr/bin/rdma")) {
		t.Errorf("error %v, want one naming usr/bin/rdma", err)
	}
}

func TestDependsOn(t *testing.T) {
	for _, c := range []struct{ depends, prefix, want string }{
		{"linux-image-6.1.0-57-amd64 (= 6.1.192-3)", "linux-image-", "linux-image-6.1.0-57-amd64"},
		{"linux-headers-6.1.0-57-common (= 6.1.192-3), linux-kbuild-6.1 (= 6.1.192-3)", "linux-kbuild-", "linux-kbuild-6.1"},
		{"libc6 (>= 2.34), gcc-12 | gcc-12:amd64", "gcc-", "gcc-12"},
	} {
		got, err := dependsOn(c.depends, c.prefix)
		if err != nil || got != c.want {
			t.Errorf("dependsOn(%q, %q) = %q, %v; want %q", c.depends, c.prefix, got, err, c.want)
		}
	}
	if _, err := dependsOn("libc6", "linux-image-"); err == nil {
		t.Error("no match: want an error")
	}
}

func TestInitScriptReportsFailures(t *testing.T) {
	s := initScript([]string{"/lib/modules/r/00-ib_core.ko"}, true, "/guest/guest.test", []string{"-test.run=it's"}, []string{"A=b c"})
	for _, want := range []string{
		`insmod /lib/modules/r/00-ib_core.ko || fail "module 00-ib_core.ko failed to load"`,
		"rdma link add siw0 type siw netdev eth0",
		`export 'A=b c'`,
		`'/guest/guest.test' '-test.run=it'\''s' > $R 2>&1`,
		markerExit + "$?",
	} {
		if !bytes.Contains([]byte(s), []byte(want)) {
			t.Errorf("init script lacks %q:\n%s", want, s)
		}
	}
}

func TestParseStanzas(t *testing.T) {
	out := []byte("Package: linux-image-amd64\nVersion: 6.1.192-3\nDepends: linux-image-6.1.0-57-amd64 (= 6.1.192-3)\n" +
		"Description-en: Linux for\n 64-bit PCs (meta-package)\nFilename: pool/main/l/linux-signed-amd64/linux-image-amd64_6.1.192-3_amd64.deb\n\n" +
		"Package: libibverbs1\nVersion: 44.0-2\nFilename: pool/main/r/rdma-core/libibverbs1_44.0-2_amd64.deb\n")
	ps := parseStanzas(out)
	if len(ps) != 2 || ps[0].Name != "linux-image-amd64" || ps[0].Version != "6.1.192-3" ||
		ps[0].Depends != "linux-image-6.1.0-57-amd64 (= 6.1.192-3)" || ps[1].Filename != "pool/main/r/rdma-core/libibverbs1_44.0-2_amd64.deb" {
		t.Errorf("parseStanzas = %+v", ps)
	}
}
