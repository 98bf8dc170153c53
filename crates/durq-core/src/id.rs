//! Job identifiers: 128-bit, time-ordered UUIDv7 values minted by the store.
//!
//! The `uuid` crate formats, parses and checks them and keeps the counter they are
//! minted from; this module adds what a job id promises beyond a UUID: only version 7
//! is accepted, and ids minted by one process sort in the order they were minted.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::str::FromStr;
use std::sync::{Mutex, PoisonError};

use uuid::{ClockSequence, Uuid};

use crate::time::Timestamp;

/// The identifier of a job: a UUIDv7 (48-bit millisecond timestamp, then a counter
/// and random bits), minted by the store at enqueue.
///
/// Ids minted by one process are strictly increasing, even within one millisecond
/// and even if the clock stands still, so ordering by id is ordering by creation.
/// The canonical string form is the hyphenated lower-case UUID.
///
/// Converts to and from [`uuid::Uuid`]; only a version 7 UUID is a job id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(u128);

/// The (millisecond, counter) pairs ids are minted from: `uuid`'s `ContextV7`, which
/// reseeds a 42-bit counter from random bits when the millisecond moves forward, counts
/// up within a millisecond, and moves the millisecond forward when the counter runs out.
/// Each pair is greater than the ones before, which is what `JobId::mint` promises.
struct Sequence {
    context: uuid::ContextV7,
    /// The millisecond of the last pair handed out.
    last_millis: u64,
}

impl Sequence {
    const fn new() -> Self {
        Sequence {
            context: uuid::ContextV7::new(),
            last_millis: 0,
        }
    }

    /// The next pair, for a job created at `millis` (at most 48 bits).
    fn next(&mut self, millis: u64) -> (u64, u64) {
        // The context is never given a millisecond before the last one it handed out:
        // uuid 1.26's ContextV7, given a time earlier than its last one and in an
        // earlier second, keeps its second but takes the given sub-second part, jumping
        // ahead, and hands out an earlier millisecond on the next call (fixed in uuid
        // 1.27, which needs Rust 1.89). Raised, the time stands still, and the counter
        // alone orders the ids, as the context would do itself.
        let millis = millis.max(self.last_millis);
        // Below 1000, so the cast is exact.
        let sub_millis = (millis % 1000) as u32;
        let (counter, seconds, nanos) = self
            .context
            .generate_timestamp_sequence(millis / 1000, sub_millis * 1_000_000);
        self.last_millis = seconds * 1000 + u64::from(nanos / 1_000_000);
        (self.last_millis, counter)
    }
}

/// The one sequence of this process, whichever store and clock mint from it.
static SEQUENCE: Mutex<Sequence> = Mutex::new(Sequence::new());

/// The width of `ContextV7`'s counter (`ClockSequence::usable_bits`).
const COUNTER_BITS: u32 = 42;
/// The counter bits that go into `rand_b`, after the 12 of `rand_a`.
const COUNTER_LOW_BITS: u32 = COUNTER_BITS - 12;
/// The largest millisecond a UUIDv7 holds (48 bits, the year 10889).
const MAX_MILLIS: i64 = 0xffff_ffff_ffff;

impl JobId {
    /// Mints a new id for a job created at `now`.
    ///
    /// The result is greater than every id this process minted before, so ids minted
    /// one after another sort in creation order even when `now` repeats or goes back.
    pub fn mint(now: Timestamp) -> Self {
        // Out-of-range instants are pinned to the ends of the 48-bit field, so the
        // sequence never sees a time that would wrap around in the id.
        let millis = now.as_millis().clamp(0, MAX_MILLIS).unsigned_abs();
        let (millis, counter) = SEQUENCE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next(millis);
        // The sequence's millisecond is past `now` when time went back; it stays within
        // 48 bits unless 2^41 ids are minted in the last millisecond there is.
        let millis = u128::from(millis) & 0xffff_ffff_ffff;
        let counter = u128::from(counter) & ((1 << COUNTER_BITS) - 1);
        // The layout `Uuid::new_v7` gives a 42-bit counter (RFC 9562 §6.2, method 1),
        // written with integer operations: `new_v7` assembles the id byte by byte and
        // made a mint about three times slower (40 ns more per id, measured).
        JobId(
            (millis << 80)
                | (0x7 << 76)
                | ((counter >> COUNTER_LOW_BITS) << 64)
                | (0b10 << 62)
                | ((counter & ((1 << COUNTER_LOW_BITS) - 1)) << 32)
                | u128::from(rand::random::<u32>()),
        )
    }

    /// The id as a 128-bit integer (big-endian UUID bytes).
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Builds an id from its 128-bit integer form, checking the UUIDv7 version and variant.
    pub fn from_u128(value: u128) -> Result<Self, ParseJobIdError> {
        Self::try_from(Uuid::from_u128(value))
    }

    /// The 16 bytes of the UUID, big-endian (sorts like the id).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// Builds an id from its 16 big-endian bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Result<Self, ParseJobIdError> {
        Self::try_from(Uuid::from_bytes(bytes))
    }

    /// The millisecond timestamp embedded in the id.
    pub fn timestamp(self) -> Timestamp {
        // The top 48 bits of a UUIDv7 are its Unix time in milliseconds (RFC 9562
        // §5.7); below 2^48, so the cast is exact.
        Timestamp::from_millis((self.0 >> 80) as i64)
    }

    fn uuid(self) -> Uuid {
        Uuid::from_u128(self.0)
    }
}

/// The length of the canonical text.
const TEXT_LEN: usize = uuid::fmt::Hyphenated::LENGTH;

impl JobId {
    /// The canonical text (lower-case hex, dashes after the 8th, 12th, 16th and 20th
    /// digit) as bytes on the stack. Backends format ids once or more per job on their
    /// hot paths, so this avoids the formatting machinery and any allocation.
    pub fn to_canonical_bytes(self) -> [u8; TEXT_LEN] {
        let mut out = [0; TEXT_LEN];
        self.uuid().hyphenated().encode_lower(&mut out);
        out
    }

    /// Appends the canonical text to `out`.
    pub fn push_canonical(self, out: &mut String) {
        let mut buffer = [0; TEXT_LEN];
        out.push_str(self.uuid().hyphenated().encode_lower(&mut buffer));
    }

    /// Parses the canonical text (hex digits of either case) from bytes, as a backend
    /// reads them from a reply, without building a string first.
    pub fn parse_canonical(bytes: &[u8]) -> Result<Self, ParseJobIdError> {
        // `uuid` also reads the simple, braced and URN forms, told apart by their
        // length; a job id has one text form only.
        if bytes.len() != TEXT_LEN {
            return Err(ParseJobIdError::NOT_CANONICAL);
        }
        let uuid = Uuid::try_parse_ascii(bytes).map_err(|_| ParseJobIdError::NOT_CANONICAL)?;
        Self::try_from(uuid)
    }
}

impl From<JobId> for Uuid {
    fn from(id: JobId) -> Uuid {
        id.uuid()
    }
}

impl TryFrom<Uuid> for JobId {
    type Error = ParseJobIdError;

    /// Accepts a UUID of version 7 and the RFC 9562 variant, the only ones minted.
    fn try_from(uuid: Uuid) -> Result<Self, ParseJobIdError> {
        if uuid.get_version() != Some(uuid::Version::SortRand)
            || uuid.get_variant() != uuid::Variant::RFC4122
        {
            return Err(ParseJobIdError::NOT_V7);
        }
        Ok(JobId(uuid.as_u128()))
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buffer = [0; TEXT_LEN];
        f.write_str(self.uuid().hyphenated().encode_lower(&mut buffer))
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

/// Text, bytes or a UUID that are not a job id: not the canonical UUID text, or a UUID
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

/// A hasher for maps keyed by [`JobId`], much cheaper than the default SipHash: the
/// `rustc-hash` crate's `FxHasher`, two multiplies for an id.
///
/// Job ids are minted by stores, not chosen by callers, and their low bits already
/// vary (a per-millisecond counter over random bits), so a multiplicative hash spreads
/// them over the table; SipHash's protection against chosen keys buys nothing here and
/// costs a noticeable share of a job's bookkeeping in the memory store and the worker
/// runtime. Its values are not stable across versions: never store them.
#[derive(Clone, Default)]
pub struct JobIdHasher(rustc_hash::FxHasher);

impl fmt::Debug for JobIdHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("JobIdHasher").field(&self.finish()).finish()
    }
}

impl Hasher for JobIdHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0.finish()
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    // Every fixed-width write goes to FxHasher's own, not through `write`'s bytes.
    #[inline]
    fn write_u8(&mut self, value: u8) {
        self.0.write_u8(value);
    }

    #[inline]
    fn write_u16(&mut self, value: u16) {
        self.0.write_u16(value);
    }

    #[inline]
    fn write_u32(&mut self, value: u32) {
        self.0.write_u32(value);
    }

    #[inline]
    fn write_u64(&mut self, value: u64) {
        self.0.write_u64(value);
    }

    #[inline]
    fn write_u128(&mut self, value: u128) {
        self.0.write_u128(value);
    }

    #[inline]
    fn write_usize(&mut self, value: usize) {
        self.0.write_usize(value);
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
    fn ids_keep_increasing_when_the_clock_goes_back() {
        let later = Timestamp::from_millis(1_800_000_000_000);
        let earlier = Timestamp::from_millis(1_600_000_000_000);
        let mut ids = vec![JobId::mint(later)];
        ids.extend((0..1_000).map(|_| JobId::mint(earlier)));
        ids.push(JobId::mint(later));
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        // Instants the 48-bit field cannot hold are pinned to its ends.
        let before_epoch = JobId::mint(Timestamp::from_millis(-5));
        let after_max = JobId::mint(Timestamp::from_millis(i64::MAX));
        assert!(JobId::from_u128(before_epoch.as_u128()).is_ok());
        assert!(after_max.timestamp() >= Timestamp::from_millis(0xffff_ffff_ffff));
    }

    #[test]
    fn the_sequence_increases_when_time_goes_back_across_a_second() {
        // A fresh sequence: the process-wide one is shared with the other tests.
        let mut sequence = Sequence::new();
        let first = sequence.next(1_700_000_000_100);
        // 200 ms earlier, in the second before: uuid 1.26's ContextV7 alone answers
        // 1_700_000_000_900 here, then 1_700_000_000_500 for the next call.
        let back = sequence.next(1_699_999_999_900);
        let forward = sequence.next(1_700_000_000_500);
        assert!(
            first < back && back < forward,
            "{first:?} {back:?} {forward:?}"
        );
        assert_eq!(back.0, first.0, "the time stood still");
        let mut last = forward;
        for millis in [
            1_700_000_000_499,
            1_700_000_000_500,
            1_700_000_001_000,
            5,
            1_700_000_001_001,
        ] {
            let next = sequence.next(millis);
            assert!(next > last, "{millis}: {next:?} after {last:?}");
            last = next;
        }
    }

    #[test]
    fn minted_ids_have_the_layout_uuid_gives_a_counter() {
        assert_eq!(
            uuid::ContextV7::new().usable_bits(),
            COUNTER_BITS as usize,
            "the counter's width changed: the packing in `mint` must follow"
        );
        for counter in [
            0,
            1,
            0x2aa_aaaa_aaaa,
            0x155_5555_5555,
            (1 << COUNTER_BITS) - 1,
        ] {
            let timestamp =
                uuid::Timestamp::from_unix_time(1_700_000_000, 123_000_000, counter, 42);
            let theirs = Uuid::new_v7(timestamp).as_u128();
            let millis: u128 = 1_700_000_000_123;
            let ours = (millis << 80)
                | (0x7 << 76)
                | ((counter >> COUNTER_LOW_BITS) << 64)
                | (0b10 << 62)
                | ((counter & ((1 << COUNTER_LOW_BITS) - 1)) << 32);
            // All but the 32 random bits at the end.
            assert_eq!(theirs >> 32, ours >> 32, "counter {counter:#x}");
        }
        let id = JobId::mint(Timestamp::from_millis(1_700_000_000_000));
        assert_eq!(Uuid::from(id).get_version(), Some(uuid::Version::SortRand));
        assert_eq!(Uuid::from(id).get_variant(), uuid::Variant::RFC4122);
    }

    #[test]
    fn only_version_7_of_the_rfc_variant_is_an_id() {
        let v7: u128 = 0x0123_4567_89ab_7def_8123_4567_89ab_cdef;
        assert!(JobId::from_u128(v7).is_ok());
        let v4 = v7 & !(0xf << 76) | (0x4 << 76);
        let ncs_variant = v7 & !(0b11 << 62);
        for bad in [0, u128::MAX, v4, ncs_variant] {
            let err = JobId::from_u128(bad).expect_err("not a v7 id");
            assert_eq!(err.to_string(), "invalid id: not a UUIDv7");
            assert!(JobId::try_from(Uuid::from_u128(bad)).is_err());
        }
        let id = JobId::from_u128(v7).expect("a v7 id");
        assert_eq!(Uuid::from(id).as_u128(), v7);
        assert_eq!(JobId::try_from(Uuid::from(id)), Ok(id));
        // The other text forms of a UUID are not the canonical one.
        for other in [
            "0123456789ab7def8123456789abcdef",
            "{01234567-89ab-7def-8123-456789abcdef}",
            "urn:uuid:01234567-89ab-7def-8123-456789abcdef",
        ] {
            let err = other.parse::<JobId>().expect_err("not canonical");
            assert_eq!(err.to_string(), "invalid id: not a canonical UUID string");
        }
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
