package v1alpha1

import (
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
)

// MemlockUnlimited is the memlock value that sets no limit.
const MemlockUnlimited = "unlimited"

// Memlock is a parsed memlock value: Unlimited, or Bytes > 0.
//
// +k8s:deepcopy-gen=false
type Memlock struct {
	Unlimited bool
	Bytes     int64
}

// ParseMemlock reads HcaConfig.Memlock (and the daemon's --memlock):
// "unlimited" or a positive whole quantity of bytes, as Kubernetes writes
// quantities ("256Mi", "1G", "1073741824").
func ParseMemlock(s string) (Memlock, error) {
	if s == MemlockUnlimited {
		return Memlock{Unlimited: true}, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return Memlock{}, fmt.Errorf("want %q or a quantity of bytes such as 256Mi, got %q", MemlockUnlimited, s)
	}
	n, exact := q.AsInt64()
	if !exact || n <= 0 {
		return Memlock{}, fmt.Errorf("want %q or a positive whole number of bytes such as 256Mi, got %q", MemlockUnlimited, s)
	}
	return Memlock{Bytes: n}, nil
}

// String is the value as the hook takes it: "unlimited" or a byte count.
func (m Memlock) String() string {
	if m.Unlimited {
		return MemlockUnlimited
	}
	return strconv.FormatInt(m.Bytes, 10)
}

// Exceeds reports whether m is more than ceiling.
func (m Memlock) Exceeds(ceiling Memlock) bool {
	switch {
	case ceiling.Unlimited:
		return false
	case m.Unlimited:
		return true
	}
	return m.Bytes > ceiling.Bytes
}
