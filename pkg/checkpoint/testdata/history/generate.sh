#!/bin/sh
# Writes checkpoint-v1-<commit>.json: the file Store.Save of <commit> writes
# for the claims of ../checkpoint-v1.golden.json (see goldengen.go.txt). Run
# once per commit that changes the checkpoint's shape; the outputs are
# committed and never regenerated (they are what those releases left on
# nodes).
#
#   pkg/checkpoint/testdata/history/generate.sh <commit>...
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(git -C "$here" rev-parse --show-toplevel)
input=$(mktemp)
trap 'rm -f "$input"' EXIT
# The data value of the current golden file.
python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["data"]))' "$here/../checkpoint-v1.golden.json" >"$input"
for commit in "$@"; do
	short=$(git -C "$repo" rev-parse --short=7 "$commit")
	wt=$(mktemp -d)
	git -C "$repo" worktree add -q --detach "$wt" "$commit"
	mkdir -p "$wt/cmd/goldengen"
	cp "$here/goldengen.go.txt" "$wt/cmd/goldengen/main.go"
	out="$here/checkpoint-v1-$short.json"
	rm -f "$out"
	(cd "$wt" && go run ./cmd/goldengen "$input" "$out")
	chmod 0644 "$out"
	git -C "$repo" worktree remove --force "$wt"
	echo "wrote $out"
done
