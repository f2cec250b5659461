// +k8s:deepcopy-gen=package
// +groupName=rdma.dra.dev

// Package v1alpha1 is the configuration users hand the rdma.dra.dev driver
// through a ResourceClaim's or DeviceClass's config[].opaque.parameters.
//
// Versioning promise: within v1alpha1, fields are only ever added, never
// renamed, removed or given a new meaning, and an omitted field always means
// its documented default, so a config that decodes today keeps decoding to
// the same behaviour. Decoding stays strict (unknown or duplicate fields,
// a wrong apiVersion or kind, and wrong types are errors) so that a typo
// fails the claim's prepare with a message naming the field instead of
// being silently ignored. A change that needs a different meaning gets a
// new version, and the driver then decodes both.
//
// The types are registered in a runtime.Scheme (register.go) and decoded
// through its strict JSON serializer; zz_generated.deepcopy.go is written
// by deepcopy-gen, a tool of go.mod, from the go:generate line of doc.go
// (make generate runs it; a test checks the file is current).
package v1alpha1

//go:generate go tool deepcopy-gen --output-file zz_generated.deepcopy.go --go-header-file /dev/null .

const (
	// GroupName is the API group, equal to the default driver name.
	GroupName = "rdma.dra.dev"
	// Version is this package's API version.
	Version = "v1alpha1"
	// Kind is the kind of the one object this version defines.
	Kind = "HcaConfig"
	// APIVersion is the apiVersion field a config must carry.
	APIVersion = GroupName + "/" + Version
)
