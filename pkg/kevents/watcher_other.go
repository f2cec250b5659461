//go:build !linux

package kevents

import "errors"

// Watcher is only implemented on Linux.
type Watcher struct{}

// Option configures Open.
type Option func()

// Open fails: netlink is Linux's.
func Open(...Option) (*Watcher, error) { return nil, errors.New("kernel events need Linux netlink") }

// Events, Err and Close exist so callers compile everywhere.
func (*Watcher) Events() <-chan Event { return nil }
func (*Watcher) Err() error           { return nil }
func (*Watcher) Close() error         { return nil }
