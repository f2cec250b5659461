// Package pkey reads InfiniBand partition keys (P_Keys) as sysfs prints
// them and users write them. It is the one parser of that text: pkg/hca
// reads the ports' tables with it and the config API checks a claim's key
// with it. It imports only the standard library, so the API does not link
// the sysfs reader and pkg/hca does not link Kubernetes.
package pkey

import (
	"fmt"
	"strconv"
)

// Parse reads a P_Key: 1 to 4 hex digits, with or without one "0x" or
// "0X" ("0x8001", "7fff"). Every 16-bit value is a key; 0x0000 and 0x8000
// are the empty entries of a table, which ParsePartition refuses.
func Parse(s string) (uint16, error) {
	h := s
	if len(h) > 2 && h[0] == '0' && (h[1] == 'x' || h[1] == 'X') {
		h = h[2:]
	}
	v, err := strconv.ParseUint(h, 16, 16)
	if len(h) == 0 || len(h) > 4 || err != nil {
		return 0, fmt.Errorf("want a P_Key of 1 to 4 hex digits such as \"0x8001\", got %q", s)
	}
	return uint16(v), nil
}

// ParsePartition is Parse for a key that must name a partition: one whose
// low 15 bits (the partition; the 0x8000 bit is full membership) are not
// all zero.
func ParsePartition(s string) (uint16, error) {
	v, err := Parse(s)
	if err != nil {
		return 0, err
	}
	if v&0x7fff == 0 {
		return 0, fmt.Errorf("%q is not a partition (its low 15 bits are zero)", s)
	}
	return v, nil
}
