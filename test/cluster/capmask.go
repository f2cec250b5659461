package cluster

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// ParseCapMask reads field ("CapEff") out of a /proc/<pid>/status text.
func ParseCapMask(status, field string) (uint64, error) {
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == field {
			return strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		}
	}
	return 0, fmt.Errorf("no %s in the process status", field)
}
