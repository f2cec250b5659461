// Package prefilter is a prototype of the allocator change proposed in
// docs/performance.md, for `make bench-scale-prefilter` only: apply.sh
// copies this file (package renamed) into the three allocators of a copy of
// k8s.io/dynamic-resource-allocation and calls classAdmitsDriver at the top
// of isSelectable. Nothing ships with it.
//
// A class selector that is `device.driver == "<name>"`, alone or as the
// first operand of a chain of && (no || or ?: anywhere in it, so the chain
// is the whole expression), admits only that driver's devices. isSelectable
// then rejects every other driver's device before converting its
// attributes for CEL. Expressions of any other form pin nothing.
package prefilter

import (
	"regexp"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
)

var driverEquality = regexp.MustCompile(`^\s*device\.driver\s*==\s*(?:"([^"\\]+)"|'([^'\\]+)')\s*(?:&&|$)`)

// pinnedDrivers caches pinnedDriver per expression.
var pinnedDrivers sync.Map

func pinnedDriver(expr string) string {
	if v, ok := pinnedDrivers.Load(expr); ok {
		return v.(string)
	}
	driver := ""
	if !strings.ContainsAny(expr, "|?") {
		if m := driverEquality.FindStringSubmatch(expr); m != nil {
			driver = m[1] + m[2]
		}
	}
	pinnedDrivers.Store(expr, driver)
	return driver
}

// classAdmitsDriver is false when a selector of the class pins another driver.
func classAdmitsDriver(class *resourceapi.DeviceClass, driver string) bool {
	for _, s := range class.Spec.Selectors {
		if s.CEL == nil {
			continue
		}
		if d := pinnedDriver(s.CEL.Expression); d != "" && d != driver {
			return false
		}
	}
	return true
}
