package checkpoint

import (
	"fmt"
	"path/filepath"
	"testing"
)

// manyClaims is a busy node's checkpoint: n claims of two devices each.
func manyClaims(n int) Checkpoint {
	cp := Checkpoint{Claims: map[string]Claim{}}
	base := sample().Claims["b-uid"]
	for i := range n {
		c := base
		c.UID = fmt.Sprintf("%08d-8f0e-4c55-9d8e-0c1f2a3b4c5d", i)
		cp.Claims[c.UID] = c
	}
	return cp
}

var fsyncModes = []struct {
	name string
	opts []Option
}{
	{"fsync", nil},
	{"bootscoped", []Option{BootScoped()}},
}

func BenchmarkSave(b *testing.B) {
	for _, mode := range fsyncModes {
		for _, n := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/claims=%d", mode.name, n), func(b *testing.B) {
				s := NewStore(filepath.Join(b.TempDir(), "checkpoint.json"), mode.opts...)
				cp := manyClaims(n)
				b.ReportAllocs()
				for b.Loop() {
					if err := s.Save(cp); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkUpdate is the prepare path's cost: one claim added to a
// checkpoint of n, from memory, written out.
func BenchmarkUpdate(b *testing.B) {
	for _, mode := range fsyncModes {
		for _, n := range []int{1, 100} {
			b.Run(fmt.Sprintf("%s/claims=%d", mode.name, n), func(b *testing.B) {
				s := NewStore(filepath.Join(b.TempDir(), "checkpoint.json"), mode.opts...)
				if err := s.Save(manyClaims(n)); err != nil {
					b.Fatal(err)
				}
				c := sample().Claims["a-uid"]
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					err := s.Update(func(cp *Checkpoint) error {
						c.Name = fmt.Sprint(i) // a change every time, so every Update writes
						cp.Claims[c.UID] = c
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
