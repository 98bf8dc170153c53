//! The operations M1 draws, and the proptest strategy that draws them.
//!
//! Operations name jobs and claims by position (`job % jobs so far`,
//! `claim % claims so far`) rather than by id, so any sequence is meaningful and a
//! shrunk sequence still is.

use proptest::prelude::*;
use proptest::strategy::{SBoxedStrategy, Union};

use durq_core::JobState;

/// Which job or claim an operation acts on: the `n`th (modulo their number) of those
/// the operation is interesting for (a claim still held, a dead job to retry, …), or,
/// when `wide`, of all of them, so calls on stale claims and on jobs in the wrong state
/// are exercised too.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pick {
    pub n: u16,
    pub wide: bool,
}

impl std::fmt::Debug for Pick {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.n, if self.wide { "/any" } else { "" })
    }
}

fn pick() -> impl Strategy<Value = Pick> {
    (any::<u16>(), prop_oneof![3 => Just(false), 1 => Just(true)])
        .prop_map(|(n, wide)| Pick { n, wide })
}

/// The token a lease call carries, relative to the claim it acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tok {
    /// The claim's own token.
    Own,
    /// One above: never issued yet, unless the job was claimed again since.
    Next,
    /// One below: the previous holder's token (0, never issued, on a first claim).
    Prev,
}

/// How a new job is tied to others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    /// Neither an idempotency key nor a parent.
    None,
    /// Idempotency key `k{n}`.
    Key(u8),
    /// The parent is job `n % jobs so far` (perhaps purged: then refused, E7).
    Parent(u16),
}

/// A job to enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spec {
    /// Queue index.
    pub queue: u8,
    /// Tenant index (0 is the default, empty tenant).
    pub tenant: u8,
    pub link: Link,
    pub priority: i16,
    /// `run_at` as an offset from now in ms; `None` leaves the default (now).
    pub delay: Option<i64>,
    /// 0 is invalid (E7).
    pub max_attempts: u32,
    /// Payload variant.
    pub payload: u8,
}

/// Where a clock jump lands; each picks the `n`th (modulo) of the jobs it applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// The lease expiry of a running job.
    LeaseExpiry(u16),
    /// The `run_at` of a scheduled job.
    RunAt(u16),
    /// The end of the dedup window of a job with an idempotency key.
    DedupEnd(u16),
    /// The end of the retention of a finished job.
    RetentionEnd(u16),
}

/// One step of a sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    Enqueue(Spec),
    EnqueueBatch(Vec<Spec>),
    /// `queues`: 0 = [a], 1 = [b], 2 = [a, b], 3 = [b, a], 4 = [] (invalid, C1).
    Claim {
        worker: u8,
        queues: u8,
        limit: usize,
        ttl_ms: u64,
    },
    /// `token`: the claim's own token, or one beside it (a forged or an old one).
    Heartbeat {
        claim: Pick,
        token: Tok,
        ttl_ms: u64,
    },
    Complete {
        claim: Pick,
        token: Tok,
        result: bool,
    },
    /// `complete_batch` of these entries (claim, token, with a result), in order; two
    /// entries may name the same claim.
    CompleteBatch(Vec<(Pick, Tok, bool)>),
    /// `retry_in`: `None` is `Retry::Never`, else `Retry::At(now + ms)`.
    Fail {
        claim: Pick,
        token: Tok,
        retry_in: Option<i64>,
    },
    Release {
        claim: Pick,
        token: Tok,
    },
    Reclaim {
        limit: usize,
    },
    Cancel {
        job: Pick,
    },
    Retry {
        job: Pick,
    },
    Purge {
        limit: usize,
    },
    Get {
        job: Pick,
    },
    Children {
        job: Pick,
    },
    Stats {
        queue: u8,
    },
    List {
        queue: u8,
        state: Option<JobState>,
        page: usize,
    },
    Advance {
        ms: i64,
    },
    /// Sets the clock to a mark plus `offset` ms (-1, 0 or +1), if that is not in
    /// the past.
    AdvanceTo {
        mark: Mark,
        offset: i64,
    },
}

/// Lease lengths drawn for claims and heartbeats.
pub(crate) const TTLS_MS: [u64; 3] = [1_000, 2_000, 5_000];

fn spec() -> impl Strategy<Value = Spec> {
    let link = prop_oneof![
        5 => Just(Link::None),
        5 => (0..3u8).prop_map(Link::Key),
        1 => any::<u16>().prop_map(Link::Parent),
    ];
    let delay = prop_oneof![
        8 => Just(None),
        1 => Just(Some(-40)),
        1 => Just(Some(0)),
        2 => Just(Some(300)),
        1 => Just(Some(2_500)),
    ];
    let max_attempts = prop_oneof![
        4 => Just(1u32),
        6 => Just(2u32),
        4 => Just(3u32),
        3 => Just(25u32),
        1 => Just(0u32),
    ];
    (
        0..2u8,
        prop_oneof![4 => Just(0u8), 1 => Just(1u8)],
        link,
        -1i16..=1,
        delay,
        max_attempts,
        0..3u8,
    )
        .prop_map(
            |(queue, tenant, link, priority, delay, max_attempts, payload)| Spec {
                queue,
                tenant,
                link,
                priority,
                delay,
                max_attempts,
                payload,
            },
        )
}

fn limit() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 6 => Just(1usize), 2 => Just(2usize), 2 => Just(3usize)]
}

fn ttl() -> impl Strategy<Value = u64> {
    prop::sample::select(&TTLS_MS[..])
}

fn state() -> impl Strategy<Value = Option<JobState>> {
    prop_oneof![
        2 => Just(None),
        1 => prop::sample::select(&JobState::ALL[..]).prop_map(Some),
    ]
}

fn offset() -> impl Strategy<Value = i64> {
    -1i64..=1
}

fn mark() -> impl Strategy<Value = Mark> {
    prop_oneof![
        4 => any::<u16>().prop_map(Mark::LeaseExpiry),
        2 => any::<u16>().prop_map(Mark::RunAt),
        2 => any::<u16>().prop_map(Mark::DedupEnd),
        2 => any::<u16>().prop_map(Mark::RetentionEnd),
    ]
}

fn weighted(arms: Vec<(u32, SBoxedStrategy<Op>)>) -> Union<SBoxedStrategy<Op>> {
    Union::new_weighted(arms)
}

/// One operation, weighted so that sequences build up work, claim it, and then move
/// it through every state.
pub(crate) fn op() -> impl Strategy<Value = Op> {
    let forge = prop_oneof![8 => Just(Tok::Own), 1 => Just(Tok::Next), 1 => Just(Tok::Prev)];
    let retry_in = prop_oneof![
        2 => Just(None),
        1 => Just(Some(-5)),
        1 => Just(Some(0)),
        2 => Just(Some(400)),
        1 => Just(Some(3_000)),
    ];
    let advance = prop_oneof![
        1 => Just(1i64),
        1 => Just(7i64),
        2 => Just(250i64),
        2 => Just(1_000i64),
        1 => Just(2_500i64),
        1 => Just(20 * 60 * 1_000i64),
        1 => Just(45 * 60 * 1_000i64),
    ];
    weighted(vec![
        (14, spec().prop_map(Op::Enqueue).sboxed()),
        (
            3,
            prop::collection::vec(spec(), 1..=4)
                .prop_map(Op::EnqueueBatch)
                .sboxed(),
        ),
        (
            10,
            (
                0..3u8,
                prop_oneof![10 => 0..4u8, 1 => Just(4u8)],
                limit(),
                ttl(),
            )
                .prop_map(|(worker, queues, limit, ttl_ms)| Op::Claim {
                    worker,
                    queues,
                    limit,
                    ttl_ms,
                })
                .sboxed(),
        ),
        (
            4,
            (pick(), forge.clone(), ttl())
                .prop_map(|(claim, token, ttl_ms)| Op::Heartbeat {
                    claim,
                    token,
                    ttl_ms,
                })
                .sboxed(),
        ),
        (
            5,
            (pick(), forge.clone(), any::<bool>())
                .prop_map(|(claim, token, result)| Op::Complete {
                    claim,
                    token,
                    result,
                })
                .sboxed(),
        ),
        (
            2,
            prop::collection::vec((pick(), forge.clone(), any::<bool>()), 1..=4)
                .prop_map(Op::CompleteBatch)
                .sboxed(),
        ),
        (
            5,
            (pick(), forge.clone(), retry_in)
                .prop_map(|(claim, token, retry_in)| Op::Fail {
                    claim,
                    token,
                    retry_in,
                })
                .sboxed(),
        ),
        (
            3,
            (pick(), forge)
                .prop_map(|(claim, token)| Op::Release { claim, token })
                .sboxed(),
        ),
        (
            4,
            (1..=3usize)
                .prop_map(|limit| Op::Reclaim { limit })
                .sboxed(),
        ),
        (3, pick().prop_map(|job| Op::Cancel { job }).sboxed()),
        (3, pick().prop_map(|job| Op::Retry { job }).sboxed()),
        (
            2,
            (1..=3usize).prop_map(|limit| Op::Purge { limit }).sboxed(),
        ),
        (2, pick().prop_map(|job| Op::Get { job }).sboxed()),
        (1, pick().prop_map(|job| Op::Children { job }).sboxed()),
        (1, (0..2u8).prop_map(|queue| Op::Stats { queue }).sboxed()),
        (
            1,
            (0..2u8, state(), 1..=3usize)
                .prop_map(|(queue, state, page)| Op::List { queue, state, page })
                .sboxed(),
        ),
        (6, advance.prop_map(|ms| Op::Advance { ms }).sboxed()),
        (
            7,
            (mark(), offset())
                .prop_map(|(mark, offset)| Op::AdvanceTo { mark, offset })
                .sboxed(),
        ),
    ])
}

/// A boundary jump followed at once by the operation the boundary matters to, before
/// anything else moves the clock: the cases off-by-one bugs live in.
fn idiom() -> impl Strategy<Value = Vec<Op>> {
    let at = |mark: fn(u16) -> Mark| {
        (any::<u16>(), offset()).prop_map(move |(n, offset)| Op::AdvanceTo {
            mark: mark(n),
            offset,
        })
    };
    let claim = (0..3u8, 0..4u8, ttl()).prop_map(|(worker, queues, ttl_ms)| Op::Claim {
        worker,
        queues,
        limit: 3,
        ttl_ms,
    });
    let keyed = spec().prop_map(|mut spec| {
        if !matches!(spec.link, Link::Key(_)) {
            spec.link = Link::Key(0);
        }
        spec.max_attempts = spec.max_attempts.max(1);
        Op::Enqueue(spec)
    });
    prop_oneof![
        3 => (at(Mark::LeaseExpiry), 1..=3usize)
            .prop_map(|(jump, limit)| vec![jump, Op::Reclaim { limit }]),
        1 => (at(Mark::LeaseExpiry), pick(), ttl()).prop_map(|(jump, claim, ttl_ms)| vec![
            jump,
            Op::Heartbeat { claim, token: Tok::Own, ttl_ms },
        ]),
        2 => (at(Mark::RunAt), claim).prop_map(|(jump, claim)| vec![jump, claim]),
        2 => (at(Mark::DedupEnd), keyed).prop_map(|(jump, enqueue)| vec![jump, enqueue]),
        2 => (at(Mark::RetentionEnd), 1..=3usize)
            .prop_map(|(jump, limit)| vec![jump, Op::Purge { limit }]),
    ]
}

/// A sequence of `max_len / 2` to `max_len` operations.
pub(crate) fn sequence(max_len: usize) -> SBoxedStrategy<Vec<Op>> {
    let max_len = max_len.max(1);
    // A few enqueues first, so the early steps have work to act on.
    let prelude = prop::collection::vec(spec().prop_map(Op::Enqueue), 2..=5);
    // Long sequences reach the late states (purged, retried, reclaimed twice); short
    // ones are what shrinking is for.
    let chunk = prop_oneof![
        12 => op().prop_map(|op| vec![op]),
        1 => idiom(),
    ];
    let rest = prop::collection::vec(chunk, max_len.div_ceil(2)..=max_len);
    (prelude, rest)
        .prop_map(move |(mut ops, rest)| {
            ops.extend(rest.into_iter().flatten());
            ops.truncate(max_len);
            ops
        })
        .sboxed()
}
