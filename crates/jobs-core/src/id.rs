//! Job identifiers: 128-bit, time-ordered UUIDv7 values minted by the store.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;
use std::sync::Mutex;

use crate::time::Timestamp;

/// The identifier of a job: a UUIDv7 (48-bit millisecond timestamp, then a counter
/// and random bits), minted by the store at enqueue.
///
/// Ids minted by one process are strictly increasing, even within one millisecond
/// and even if the clock stands still, so ordering by id is ordering by creation.
/// The canonical string form is the hyphenated lower-case UUID.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(u128);

const VERSION_BITS: u128 = 0x7 << 76;
const VARIANT_BITS: u128 = 0b10 << 62;
/// Bits of the id that are neither timestamp, version nor variant.
const RAND_A_MASK: u128 = 0xfff << 64;
const RAND_B_MASK: u128 = (1 << 62) - 1;

/// The last id this process minted, so the next one is greater.
static LAST_MINTED: Mutex<u128> = Mutex::new(0);

impl JobId {
    /// Mints a new id for a job created at `now`.
    ///
    /// The result is greater than every id this process minted before, so ids minted
    /// one after another sort in creation order even when `now` repeats or goes back.
    pub fn mint(now: Timestamp) -> Self {
        let millis = u128::from(now.as_millis().max(0) as u64 & 0xffff_ffff_ffff);
        // Leave headroom in the random part so the monotonic increments below do not
        // overflow into the timestamp for billions of ids within one millisecond.
        let random: u128 = rand::random::<u128>();
        let candidate = (millis << 80)
            | VERSION_BITS
            | (random & RAND_A_MASK & !(0x800 << 64))
            | VARIANT_BITS
            | (random & RAND_B_MASK);
        let mut last = LAST_MINTED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let id = if candidate > *last {
            candidate
        } else {
            Self::successor(*last)
        };
        *last = id;
        JobId(id)
    }

    /// The next UUIDv7 after `id` in sort order, keeping the version and variant bits.
    fn successor(id: u128) -> u128 {
        let rand_b = id & RAND_B_MASK;
        if rand_b < RAND_B_MASK {
            return id + 1;
        }
        // rand_b is exhausted: carry into rand_a, then into the timestamp.
        let rand_a = (id & RAND_A_MASK) >> 64;
        let ts = id >> 80;
        let (ts, rand_a) = if rand_a < 0xfff {
            (ts, rand_a + 1)
        } else {
            (ts + 1, 0)
        };
        (ts << 80) | VERSION_BITS | (rand_a << 64) | VARIANT_BITS
    }

    /// The id as a 128-bit integer (big-endian UUID bytes).
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Builds an id from its 128-bit integer form, checking the UUIDv7 version and variant.
    pub fn from_u128(value: u128) -> Result<Self, ParseJobIdError> {
        if value & (0xf << 76) != VERSION_BITS || value & (0b11 << 62) != VARIANT_BITS {
            return Err(ParseJobIdError::NOT_V7);
        }
        Ok(JobId(value))
    }

    /// The 16 bytes of the UUID, big-endian (sorts like the id).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// Builds an id from its 16 big-endian bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Result<Self, ParseJobIdError> {
        Self::from_u128(u128::from_be_bytes(bytes))
    }

    /// The millisecond timestamp embedded in the id.
    pub fn timestamp(self) -> Timestamp {
        Timestamp::from_millis((self.0 >> 80) as i64)
    }
}

/// Where the canonical text has its dashes.
const DASHES: [usize; 4] = [8, 13, 18, 23];
/// The length of the canonical text.
const TEXT_LEN: usize = 36;

impl JobId {
    /// The canonical text (lower-case hex, dashes after the 8th, 12th, 16th and 20th
    /// digit) as bytes on the stack. Backends format ids once or more per job on their
    /// hot paths, so this avoids the formatting machinery and any allocation.
    pub fn to_canonical_bytes(self) -> [u8; TEXT_LEN] {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = [b'-'; TEXT_LEN];
        let mut digit = 0;
        for (i, slot) in out.iter_mut().enumerate() {
            if DASHES.contains(&i) {
                continue;
            }
            // Truncation on purpose: one nibble at a time.
            let nibble = (self.0 >> (124 - 4 * digit)) as usize & 0xf;
            *slot = HEX[nibble];
            digit += 1;
        }
        out
    }

    /// Appends the canonical text to `out`.
    pub fn push_canonical(self, out: &mut String) {
        let bytes = self.to_canonical_bytes();
        // Every byte is an ASCII hex digit or a dash.
        out.extend(bytes.iter().map(|&b| char::from(b)));
    }

    /// Parses the canonical text (hex digits of either case) from bytes, as a backend
    /// reads them from a reply, without building a string first.
    pub fn parse_canonical(bytes: &[u8]) -> Result<Self, ParseJobIdError> {
        let invalid = || ParseJobIdError::NOT_CANONICAL;
        if bytes.len() != TEXT_LEN {
            return Err(invalid());
        }
        let mut value: u128 = 0;
        for (i, byte) in bytes.iter().enumerate() {
            if DASHES.contains(&i) {
                if *byte != b'-' {
                    return Err(invalid());
                }
                continue;
            }
            let nibble = match byte {
                b'0'..=b'9' => byte - b'0',
                b'a'..=b'f' => byte - b'a' + 10,
                b'A'..=b'F' => byte - b'A' + 10,
                _ => return Err(invalid()),
            };
            value = (value << 4) | u128::from(nibble);
        }
        Self::from_u128(value)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.to_canonical_bytes();
        // ASCII by construction, so this never fails.
        f.write_str(std::str::from_utf8(&bytes).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({self})")
    }
}

impl FromStr for JobId {
    type Err = ParseJobIdError;

    fn from_str(s: &str) -> Result<Self, ParseJobIdError> {
        Self::parse_canonical(s.as_bytes())
    }
}

impl serde::Serialize for JobId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for JobId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Text or bytes that are not a job id: not the canonical UUID text, or a UUID
/// of another version than 7. Converts into [`Error::InvalidInput`] for the field `id`,
/// so `?` works in functions returning the crate's [`Result`].
///
/// [`Error::InvalidInput`]: crate::Error::InvalidInput
/// [`Result`]: crate::Result
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseJobIdError {
    /// Why, in the words of [`Error::InvalidInput`](crate::Error::InvalidInput).
    pub(crate) reason: &'static str,
}

impl ParseJobIdError {
    const NOT_CANONICAL: Self = ParseJobIdError {
        reason: "not a canonical UUID string",
    };
    const NOT_V7: Self = ParseJobIdError {
        reason: "not a UUIDv7",
    };
}

impl fmt::Display for ParseJobIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid id: {}", self.reason)
    }
}

impl std::error::Error for ParseJobIdError {}

/// A `HashMap` keyed by job id, hashed with [`JobIdHasher`].
pub type JobIdMap<V> = HashMap<JobId, V, BuildHasherDefault<JobIdHasher>>;

/// A hasher for maps keyed by [`JobId`], much cheaper than the default SipHash.
///
/// Job ids are minted by stores, not chosen by callers, and their low bits already
/// vary (a per-process counter over random bits), so one multiply spreads them over
/// the table; SipHash's protection against chosen keys buys nothing here and costs a
/// noticeable share of a job's bookkeeping in the memory store and the worker runtime.
/// Other keys fall back to FNV-1a, correct if not fast.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobIdHasher(u64);

impl JobIdHasher {
    /// 2^64 / golden ratio: an odd constant whose multiples spread consecutive
    /// integers over the high bits, which the table's control bytes use.
    const SPREAD: u64 = 0x9e37_79b9_7f4a_7c15;
}

impl Hasher for JobIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut hash = self.0 ^ 0xcbf2_9ce4_8422_2325;
        for byte in bytes {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(FNV_PRIME);
        }
        self.0 = hash;
    }

    fn write_u128(&mut self, value: u128) {
        // Truncating casts on purpose: the two halves are folded into one word.
        let folded = (value as u64) ^ ((value >> 64) as u64);
        self.0 = (self.0 ^ folded).wrapping_mul(Self::SPREAD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_minted_at_one_instant_are_strictly_increasing() {
        let now = Timestamp::from_millis(1_700_000_000_000);
        let ids: Vec<JobId> = (0..10_000).map(|_| JobId::mint(now)).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        assert!(ids.iter().all(|id| id.timestamp() >= now));
    }

    #[test]
    fn string_form_round_trips_and_rejects_garbage() {
        let id = JobId::mint(Timestamp::from_millis(1_700_000_000_000));
        let text = id.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "7");
        assert_eq!(text.parse::<JobId>().ok(), Some(id));
        assert!("not-an-id".parse::<JobId>().is_err());
        assert!("00000000-0000-4000-8000-000000000000"
            .parse::<JobId>()
            .is_err());
        assert_eq!(JobId::from_bytes(id.to_bytes()).ok(), Some(id));
    }

    #[test]
    fn canonical_text_matches_the_uuid_layout_and_parses_either_case() {
        let value: u128 = 0x0123_4567_89ab_7def_8123_4567_89ab_cdef;
        let id = JobId::from_u128(value).expect("a v7 id");
        assert_eq!(id.to_string(), "01234567-89ab-7def-8123-456789abcdef");
        assert_eq!(
            &id.to_canonical_bytes(),
            b"01234567-89ab-7def-8123-456789abcdef"
        );
        let mut out = String::from("id:");
        id.push_canonical(&mut out);
        assert_eq!(out, "id:01234567-89ab-7def-8123-456789abcdef");
        assert_eq!(
            JobId::parse_canonical(b"01234567-89AB-7DEF-8123-456789ABCDEF").ok(),
            Some(id)
        );
        for millis in [0, 1, 1_764_000_000_000, 0xffff_ffff_ffff] {
            let id = JobId::mint(Timestamp::from_millis(millis));
            assert_eq!(id.to_string().parse::<JobId>().ok(), Some(id));
        }
        for bad in [
            &b""[..],
            b"x",
            b"01234567-89ab-7def-8123-456789abcde",
            b"01234567-89ab-7def-8123-456789abcdef0",
            b"01234567+89ab-7def-8123-456789abcdef",
            b"g1234567-89ab-7def-8123-456789abcdef",
            b"0123456789ab-7def-8123-456789abcdef-",
        ] {
            assert!(JobId::parse_canonical(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn successor_carries_without_breaking_version_bits() {
        let id = (5u128 << 80) | VERSION_BITS | RAND_A_MASK | VARIANT_BITS | RAND_B_MASK;
        let next = JobId::successor(id);
        assert!(next > id);
        assert!(JobId::from_u128(next).is_ok());
    }

    #[test]
    fn job_id_hashes_spread_consecutive_ids() {
        use std::hash::BuildHasher;
        let build = BuildHasherDefault::<JobIdHasher>::default();
        let now = Timestamp::from_millis(1_700_000_000_000);
        let hashes: Vec<u64> = (0..10_000)
            .map(|_| build.hash_one(JobId::mint(now)))
            .collect();
        let distinct: std::collections::HashSet<u64> = hashes.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            hashes.len(),
            "distinct ids, distinct hashes"
        );
        // hashbrown picks the bucket from the low bits and the control byte from the
        // top 7: both must vary.
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 0x3ff).collect();
        let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 900, "low bits spread: {}", low.len());
        assert_eq!(top.len(), 128, "top bits spread");
        let mut map = JobIdMap::default();
        let ids: Vec<JobId> = (0..1_000).map(|_| JobId::mint(now)).collect();
        for (n, id) in ids.iter().enumerate() {
            map.insert(*id, n);
        }
        for (n, id) in ids.iter().enumerate() {
            assert_eq!(map.get(id), Some(&n));
        }
    }
}
