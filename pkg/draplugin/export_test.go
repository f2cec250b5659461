package draplugin

// WaitReturnChecks waits for the background checks that moved HCAs came
// back, so tests see their warnings and counters.
func (d *Driver) WaitReturnChecks() { d.returns.running.Wait() }
