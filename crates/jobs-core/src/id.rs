//! Job identifiers: 128-bit, time-ordered UUIDv7 values minted by the store.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;

use crate::error::Error;
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
    pub fn from_u128(value: u128) -> Result<Self, Error> {
        if value & (0xf << 76) != VERSION_BITS || value & (0b11 << 62) != VARIANT_BITS {
            return Err(Error::invalid("id", "not a UUIDv7"));
        }
        Ok(JobId(value))
    }

    /// The 16 bytes of the UUID, big-endian (sorts like the id).
    pub fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }

    /// Builds an id from its 16 big-endian bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Result<Self, Error> {
        Self::from_u128(u128::from_be_bytes(bytes))
    }

    /// The millisecond timestamp embedded in the id.
    pub fn timestamp(self) -> Timestamp {
        Timestamp::from_millis((self.0 >> 80) as i64)
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = format!("{:032x}", self.0);
        write!(
            f,
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JobId({self})")
    }
}

impl FromStr for JobId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        let bytes = s.as_bytes();
        let canonical_shape = bytes.len() == 36
            && [8, 13, 18, 23].iter().all(|&i| bytes[i] == b'-')
            && bytes
                .iter()
                .enumerate()
                .all(|(i, b)| matches!(i, 8 | 13 | 18 | 23) || b.is_ascii_hexdigit());
        if !canonical_shape {
            return Err(Error::invalid("id", "not a canonical UUID string"));
        }
        let hex: String = s.chars().filter(|c| *c != '-').collect();
        let value = u128::from_str_radix(&hex, 16)
            .map_err(|_| Error::invalid("id", "not a canonical UUID string"))?;
        Self::from_u128(value)
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
    fn successor_carries_without_breaking_version_bits() {
        let id = (5u128 << 80) | VERSION_BITS | RAND_A_MASK | VARIANT_BITS | RAND_B_MASK;
        let next = JobId::successor(id);
        assert!(next > id);
        assert!(JobId::from_u128(next).is_ok());
    }
}
