//go:build race

package journal

// raceEnabled: the race detector makes every copy of a device image costly, so the crash test
// checks a sample of its crash points (see TestCrashConsistency).
const raceEnabled = true
