//go:build race

package logging

// poolSlack is the allocations per call that sync.Pool's deliberate drops add under the race
// detector (it discards a quarter of Puts to expose misuse): the journal encoder draws one more
// pooled buffer than the plain one, so it may lose one more.
const poolSlack = 1
