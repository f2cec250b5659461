#!/bin/sh
# apply.sh SRC DEST: copies k8s.io/dynamic-resource-allocation (v0.37.2, from
# the module cache at SRC) to DEST and adds the driver prefilter prototype
# (driverfilter.go) to its three allocators: isSelectable rejects a
# device whose driver a class selector excludes before any CEL evaluation.
# For `make bench-scale-prefilter` only; nothing ships with it.
set -eu
src=$1 dest=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
cp -r "$src" "$dest"
chmod -R u+w "$dest"
for pkg in stable incubating experimental; do
	dir=$dest/structured/internal/$pkg
	sed "s/^package prefilter$/package $pkg/" "$here/driverfilter.go" >"$dir/driverfilter_$pkg.go"
	file=$dir/allocator_$pkg.go
	# The hook goes before the first class check inside isSelectable.
	awk '
		/^func \(alloc \*allocator\) isSelectable\(/ { in_func = 1 }
		in_func && !done && /^\tif requestData.class != nil \{$/ {
			print "\tif requestData.class != nil && !classAdmitsDriver(requestData.class, slice.Spec.Driver.String()) {"
			print "\t\talloc.deviceMatchesRequest[matchKey] = false"
			print "\t\treturn false, nil"
			print "\t}"
			done = 1
		}
		{ print }
		END { if (!done) { print "apply.sh: isSelectable hook point not found" > "/dev/stderr"; exit 1 } }
	' "$file" >"$file.new"
	mv "$file.new" "$file"
done
