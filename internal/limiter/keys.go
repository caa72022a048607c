package limiter

// Every key of the store is spelled here, so that the Redis store, its
// scripts' arguments, the reset and the tests agree on one layout:
//
//	rolter:rl:[{<root scope>:<root id>}:]<scope>:<id>:   a limit's prefix
//	  <window>:<period>        a window's count in one period (periodKey)
//	  bkt                      the token bucket (writeBucketKey)
//	  slots                    the holders of the slots (slotsKey)
//	  reset                    the moment of the last reset (writeResetKey)
//	  learned                  the provider's quota as learned (writeLearnedKey)
//	  floors                   what the floors' classes asked and used (writeFloorsKey)
//	  f<class>:<window>:<period>   a floor's class's count in a window's period
//	  spent|reserved:<day|month>:<period>   a budget's (periodSpan.writeKey)
//
// The id is digested unless its scope is readable (KeyID), and on Redis
// Cluster the chain root's hash tag keeps a chain's keys on one slot.
import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// keysPrefix starts every key of the store.
const keysPrefix = "rolter:rl:"

// writePrefix writes the prefix of l's keys with tag:
// "rolter:rl:<tag><scope>:<id>:".
func writePrefix(b *strings.Builder, tag string, l Limit) {
	b.WriteString(keysPrefix)
	b.WriteString(tag)
	b.WriteString(l.Scope)
	b.WriteByte(':')
	b.WriteString(l.ID)
	b.WriteByte(':')
}

// prefixLen is the length of what writePrefix writes.
func prefixLen(tag string, l Limit) int {
	return len(keysPrefix) + len(tag) + len(l.Scope) + len(l.ID) + 2
}

// tagPrefixes gives each limit of chain the prefix of its keys with tag, cut
// from one string: one allocation for the chain, not one per limit.
func TagPrefixes(tag string, chain []Limit) {
	n := 0
	for _, l := range chain {
		n += prefixLen(tag, l)
	}
	var b strings.Builder
	b.Grow(n)
	for _, l := range chain {
		writePrefix(&b, tag, l)
	}
	all, at := b.String(), 0
	for i := range chain {
		end := at + prefixLen(tag, chain[i])
		chain[i].Prefix, at = all[at:end], end
	}
}

// chainTag is the hash tag of a chain rooted at the given scope id.
func ChainTag(rootScope, rootID string) string {
	return "{" + rootScope + ":" + rootID + "}:"
}

// keyID is how a scope id appears in store keys, logs, metrics, the admin
// API's answers and error bodies. Every id is "#" and the first 32 hex digits
// of its SHA-256, so that no API key, bearer token, email or customer id is
// ever written out, whatever its scope is called; only a scope declared
// readable keeps a short plain id as it is.
func KeyID(readable bool, id string) string {
	if readable && IsPlainID(id) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	var digest [33]byte
	digest[0] = '#'
	hex.Encode(digest[1:], sum[:16])
	return string(digest[:])
}

// prefixKeyID is how the pool of every id of a scope that starts with prefix
// appears: the prefix and "*" in a readable scope, when the prefix is a
// short plain token, else the digest of that.
func PrefixKeyID(readable bool, prefix string) string {
	if readable && IsPlainID(prefix) {
		return prefix + "*"
	}
	return KeyID(false, prefix+"*")
}

func IsPlainID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		plain := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
		if !plain {
			return false
		}
	}
	return true
}

// keyName is what the store appends to a limit's prefix, before ":" and
// the bucket: the minute windows keep the names they had before there were
// others.
func (k WindowKind) keyName() string {
	return [...]string{"req", "tok", "in", "out", "reqd", "tokd", "ind", "outd"}[k]
}

// periodKey is the key of a limit's window k in period b of its span.
func PeriodKey(prefix string, k WindowKind, b int64) string {
	var key strings.Builder
	writePeriodKey(&key, prefix, k, b)
	return key.String()
}

// writePeriodKey writes periodKey(prefix, k, b) to text.
func writePeriodKey(text *strings.Builder, prefix string, k WindowKind, b int64) {
	text.WriteString(prefix)
	text.WriteString(k.keyName())
	text.WriteByte(':')
	writeInt(text, b, 10)
}

// slotsKey is the key of a limit's slots: a hash of each holder's count and
// lease.
func SlotsKey(l Limit) string {
	var key strings.Builder
	writeSlotsKey(&key, l)
	return key.String()
}

// writeSlotsKey writes slotsKey(l) to text.
func writeSlotsKey(text *strings.Builder, l Limit) {
	text.WriteString(l.Prefix)
	text.WriteString("slots")
}

// writeResetKey writes to text the key of the moment the windows of the
// limit with prefix were last reset (reset.lua).
func writeResetKey(text *strings.Builder, prefix string) {
	text.WriteString(prefix)
	text.WriteString("reset")
}

// writeLearnedKey writes to text the key of what the limit with prefix
// learned of the provider's quota (learned.go).
func writeLearnedKey(text *strings.Builder, prefix string) {
	text.WriteString(prefix)
	text.WriteString("learned")
}

// writeFloorsKey writes to text the key of what the classes of the
// floors of the limit with prefix asked and used (floors.go).
func writeFloorsKey(text *strings.Builder, prefix string) {
	text.WriteString(prefix)
	text.WriteString("floors")
}

// writeNotifyKey writes to text the key of what the limit with prefix
// reported of its caps' crossings (notify.go).
func writeNotifyKey(text *strings.Builder, prefix string) {
	text.WriteString(prefix)
	text.WriteString("notified")
}

// ofClass is l as its class's windows count: with the prefix of the
// class's keys.
func (l Limit) ofClass(class uint8) Limit {
	l.Prefix += "f" + strconv.Itoa(int(class)) + ":"
	return l
}

// writeBucketKey writes to text the key of a limit's token bucket.
func writeBucketKey(text *strings.Builder, l Limit) {
	text.WriteString(l.Prefix)
	text.WriteString("bkt")
}

// writeKey writes to text the key of the budget period s, spent or
// reserved, of the limit with prefix.
func (s periodSpan) writeKey(text *strings.Builder, prefix string, p BudgetPeriod, reserved bool) {
	what := "spent:"
	if reserved {
		what = "reserved:"
	}
	text.WriteString(prefix)
	text.WriteString(what)
	text.WriteString(p.String())
	text.WriteByte(':')
	text.WriteString(s.name)
}

// hashTag is the Redis Cluster hash tag of a key (what its first braces
// hold), "" if it has none.
func hashTag(key string) string {
	_, after, ok := strings.Cut(key, "{")
	if !ok {
		return ""
	}
	tag, _, ok := strings.Cut(after, "}")
	if !ok {
		return ""
	}
	return tag
}
