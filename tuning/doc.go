// Package tuning owns how a roost node fits the machine it runs on: the
// open-file limit, the cgroup CPU quota and memory limit (turned into
// GOMAXPROCS and GOMEMLIMIT), the kernel settings that cap how many
// connections a node can hold, and the `roost tune` command that reports them
// and writes ready sysctl.d and systemd files.
//
// Every reader takes its filesystem root (an fs.FS for cgroups, a directory
// for /proc/sys) so that it is tested on fixture trees in testdata/ rather
// than on whatever machine runs the tests. Only Apply and RaiseNoFile change
// the running process.
//
// The operator's guide is docs/tuning.md.
package tuning
