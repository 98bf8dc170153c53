//! [`RedisConfig`] (and [`TlsConfig`] under the `tls` feature), the options of opening
//! a store: one server or a cluster, plain or TLS; and the opening itself, with what
//! every store loads and starts at open time.

use std::sync::Arc;
use std::time::Duration;

use durq_core::batch::Batcher;
use durq_core::validate::validate_settings;
use durq_core::{duration_millis, Error, JobId, Result, StoreSettings};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;

use crate::backend::{Inner, RedisBackend};
use crate::conn::{
    map_err, Conn, CONNECT_TIMEOUT, RECONNECT_CAP, RECONNECT_FIRST_DELAY, RECONNECT_RETRIES,
    RESPONSE_TIMEOUT,
};
use crate::keys::Keys;
use crate::partitions::MAX_PARTITIONS;
use crate::scripts;
use crate::store::enqueue::{Ctx as EnqueueCtx, Enqueues};
use crate::store::heads::Heads;
use crate::store::lease::Completions;
use crate::store::partitioned::Partitions;
use crate::wake::{Seed, Waker};

/// Garbage-collection margin on top of the dedup window: server TTLs must
/// never decide anything, so they fire well after the clock's decision.
const TTL_MARGIN_MS: i64 = 24 * 60 * 60 * 1000;
/// The longest server TTL set (100 years); longer settings just keep the keys.
const TTL_MAX_MS: i64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// What a `rediss://` URL is told when the crate was built without TLS.
#[cfg(not(feature = "tls"))]
const NO_TLS: &str = "a rediss:// URL (TLS) needs the `tls` feature of durq-redis \
                      (`redis-tls` of the jobs crate)";

fn ttl_ms(duration: Duration) -> i64 {
    duration_millis(duration)
        .saturating_add(TTL_MARGIN_MS)
        .min(TTL_MAX_MS)
}

/// Certificates for `rediss://` connections (feature `tls`) when the system's trust
/// store is not the right one: the CA that signed the server's certificate (a private
/// CA, a managed service's own), and a client certificate for servers that ask for one
/// (mutual TLS). Everything is PEM.
///
/// A `rediss://` URL needs none of this when the server's certificate chains to a root
/// the system trusts: [`RedisBackend::connect`] takes it as it is.
#[cfg(feature = "tls")]
#[derive(Clone, Default)]
pub struct TlsConfig {
    root_ca_pem: Option<Vec<u8>>,
    client_pem: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client key is a secret; the rest says only what is set.
        f.debug_struct("TlsConfig")
            .field("root_ca", &self.root_ca_pem.is_some())
            .field("client_certificate", &self.client_pem.is_some())
            .finish()
    }
}

#[cfg(feature = "tls")]
impl TlsConfig {
    /// No certificates of the caller's: the system's roots, no client certificate.
    pub fn new() -> Self {
        TlsConfig::default()
    }

    /// Trusts the CA certificates in `pem` (one or more) instead of the system's roots.
    pub fn root_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.root_ca_pem = Some(pem.into());
        self
    }

    /// Presents the certificate chain `cert_pem`, with its private key `key_pem`, to
    /// servers that authenticate clients (`tls-auth-clients yes`).
    pub fn client_auth_pem(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.client_pem = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The driver's form, once the PEM was found to hold what it must: the driver reads
    /// text without a certificate as an empty list, which would only fail at the
    /// handshake, as an unknown issuer.
    fn certificates(&self) -> Result<redis::TlsCertificates> {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::CertificateDer;
        let holds_certificates = |pem: &[u8]| {
            let mut certs = CertificateDer::pem_slice_iter(pem);
            certs.next().is_some_and(|first| first.is_ok()) && certs.all(|c| c.is_ok())
        };
        if let Some(pem) = &self.root_ca_pem {
            if !holds_certificates(pem) {
                return Err(Error::invalid(
                    "tls",
                    "the root CA PEM holds no certificate",
                ));
            }
        }
        if let Some((cert, _)) = &self.client_pem {
            if !holds_certificates(cert) {
                return Err(Error::invalid(
                    "tls",
                    "the client certificate PEM holds no certificate",
                ));
            }
        }
        Ok(redis::TlsCertificates {
            client_tls: self
                .client_pem
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.root_ca_pem.clone(),
        })
    }
}

/// Without the `tls` feature no certificates can be given: an uninhabited stand-in, so
/// the connect path is written once.
#[cfg(not(feature = "tls"))]
#[derive(Clone, Debug)]
pub(super) enum TlsConfig {}

/// Whether `url` asks for TLS (`rediss://`, or `valkeys://` as the driver also reads).
fn is_tls_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
    })
}

/// The refusal of a URL the driver could not read.
fn bad_url(field: &'static str, url_is_tls: bool, err: &redis::RedisError) -> Error {
    #[cfg(not(feature = "tls"))]
    if url_is_tls {
        return Error::invalid(field, NO_TLS);
    }
    let _ = url_is_tls;
    Error::invalid(field, format!("not a Redis URL: {err}"))
}

/// rustls needs one crypto provider for the process. With only ring built in it picks
/// ring itself; when another crate of the program also builds aws-lc-rs it would find two
/// and refuse (the driver's connection task would panic). So ring is installed unless
/// the program installed a provider of its own first.
#[cfg(feature = "tls")]
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The driver's client for one node's `url`, with `tls`'s certificates if given.
fn node_client(url: &str, tls: Option<&TlsConfig>) -> Result<redis::Client> {
    let url_is_tls = is_tls_url(url);
    let client = redis::Client::open(url).map_err(|err| bad_url("url", url_is_tls, &err))?;
    #[cfg(feature = "tls")]
    if url_is_tls {
        ensure_crypto_provider();
    }
    match tls {
        None => Ok(client),
        #[cfg(feature = "tls")]
        Some(tls) => {
            if !url_is_tls {
                return Err(Error::invalid(
                    "url",
                    "TLS certificates were given for a URL without TLS: use rediss://",
                ));
            }
            redis::Client::build_with_tls(client.get_connection_info().clone(), tls.certificates()?)
                .map_err(|err| Error::invalid("tls", format!("unusable certificates: {err}")))
        }
        #[cfg(not(feature = "tls"))]
        Some(never) => match *never {},
    }
}

/// Where a [`RedisBackend`] connects: one server or a cluster's nodes, and (feature
/// `tls`) certificates of the caller's. The one way to open a Redis backend with more
/// than a URL; [`RedisBackend::connect`] is its shortcut for one server.
///
/// ```no_run
/// use durq_core::{Store, StoreSettings};
/// use durq_redis::RedisConfig;
/// # async fn example() -> durq_core::Result<()> {
/// let cluster = RedisConfig::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
///     .open(StoreSettings::default())
///     .await?;
/// let store = Store::new(cluster);
/// # let _ = store;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedisConfig {
    nodes: Nodes,
    /// The partition count set with [`RedisConfig::partitions`]; `None` takes the URLs'
    /// `partitions` parameter, or 1.
    partitions: Option<usize>,
    /// The partitions this store's claims visit (`None`: all).
    claim_partitions: Option<Vec<usize>>,
    #[cfg(feature = "tls")]
    tls: Option<TlsConfig>,
}

impl RedisConfig {
    /// One Redis server, e.g. `redis://127.0.0.1:6379`, or `rediss://host:6380` for
    /// TLS (feature `tls`).
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            nodes: Nodes::One(url.into()),
            partitions: None,
            claim_partitions: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// A Redis Cluster, reached through any of its nodes' URLs (all `redis://`, or all
    /// `rediss://` with the `tls` feature). Every key of a namespace is in one hash
    /// slot, so every script runs on the node owning it.
    pub fn cluster<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisConfig {
            nodes: Nodes::Cluster(urls.into_iter().map(Into::into).collect()),
            partitions: None,
            claim_partitions: None,
            #[cfg(feature = "tls")]
            tls: None,
        }
    }

    /// Certificates of the caller's for `rediss://` URLs: a CA to trust, a client
    /// certificate. Feature `tls`; without it the system's roots are trusted.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Spreads the namespace over `count` partitions (1..=256; default 1, or the URL's
    /// `partitions` parameter, as in `redis://host:6379/?partitions=12`). Each
    /// partition is a hash slot of its own, so on a cluster one namespace, and one busy
    /// queue, uses every master instead of one. The claim order (CONTRACT C3) then
    /// holds within each partition, not across them; CONTRACT §8 lists what else
    /// changes.
    ///
    /// The count is fixed when a store first opens the namespace: an open with another
    /// count, or a partitioned open of a namespace an unpartitioned store wrote before,
    /// is refused (`InvalidInput { field: "partitions" }`).
    pub fn partitions(mut self, count: usize) -> Self {
        self.partitions = Some(count);
        self
    }

    /// Pins this store's claims to `partitions` of a partitioned namespace (numbered
    /// from 0): its claims, and so the workers running on it, take jobs of those
    /// partitions only, while its enqueues, reads and sweeps still reach every
    /// partition. Workers pinned to disjoint subsets divide a namespace between them;
    /// make sure every partition is served by some worker. Refused at open
    /// (`InvalidInput { field: "claim_partitions" }`) when empty, repeated, or naming a
    /// partition the namespace does not have.
    pub fn claim_partitions(mut self, partitions: impl IntoIterator<Item = usize>) -> Self {
        self.claim_partitions = Some(partitions.into_iter().collect());
        self
    }

    /// Connects, loads the scripts, and opens the backend of namespace
    /// `settings.namespace`. Settings that break the contract's limits are refused.
    pub async fn open(self, settings: StoreSettings) -> Result<RedisBackend> {
        #[cfg(feature = "tls")]
        let tls = self.tls.as_ref();
        #[cfg(not(feature = "tls"))]
        let tls: Option<&TlsConfig> = None;
        let mut store = match &self.nodes {
            Nodes::One(url) => {
                let (url, in_url) = take_partitions(url)?;
                let partitions = partition_count(self.partitions, [in_url])?;
                check_claim_partitions(self.claim_partitions.as_deref(), partitions)?;
                RedisBackend::open_single(&url, tls, settings, partitions).await?
            }
            Nodes::Cluster(urls) => {
                let mut plain = Vec::with_capacity(urls.len());
                let mut in_urls = Vec::with_capacity(urls.len());
                for url in urls {
                    let (url, in_url) = take_partitions(url)?;
                    plain.push(url);
                    in_urls.push(in_url);
                }
                let partitions = partition_count(self.partitions, in_urls)?;
                check_claim_partitions(self.claim_partitions.as_deref(), partitions)?;
                RedisBackend::open_cluster(&plain, tls, settings, partitions).await?
            }
        };
        if let Some(pinned) = self.claim_partitions {
            store.claim_only(pinned);
        }
        Ok(store)
    }
}

/// One server's URL, or the URLs of a cluster's nodes.
#[derive(Debug, Clone)]
enum Nodes {
    One(String),
    Cluster(Vec<String>),
}

impl RedisBackend {
    pub(super) async fn open_single(
        url: &str,
        tls: Option<&TlsConfig>,
        settings: StoreSettings,
        partitions: usize,
    ) -> Result<Self> {
        validate_settings(&settings)?;
        let client = node_client(url, tls)?;
        let dial = Dial::Single(Box::new(client.clone()));
        let conn = dial.connect().await?;
        Self::finish_connect(conn, dial, vec![client], settings, partitions).await
    }

    async fn open_cluster<I, S>(
        urls: I,
        tls: Option<&TlsConfig>,
        settings: StoreSettings,
        partitions: usize,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        validate_settings(&settings)?;
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        if urls.is_empty() {
            return Err(Error::invalid("urls", "name at least one cluster node"));
        }
        // Each node's client is built first: it checks every URL and the certificates,
        // and serves the wake-up subscriber (pub/sub messages reach every node of a
        // cluster, so any node serves).
        let nodes = urls
            .iter()
            .map(|url| node_client(url, tls))
            .collect::<Result<Vec<_>>>()?;
        // The driver's cluster connection reconnects a lost node by itself, continually
        // (50 ms doubling to 1 s between attempts in redis 1.8.1); each attempt is bounded
        // as a single server's is.
        let builder = ClusterClientBuilder::new(urls.clone())
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT);
        #[cfg(feature = "tls")]
        let builder = match tls {
            Some(tls) => builder.certs(tls.certificates()?),
            None => builder,
        };
        let client = builder
            .build()
            .map_err(|err| bad_url("urls", urls.iter().any(|url| is_tls_url(url)), &err))?;
        let nodes_text = nodes
            .iter()
            .map(|node| node.get_connection_info().addr().to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let dial = Dial::Cluster(Box::new(client), nodes_text.into());
        let conn = dial.connect().await?;
        Self::finish_connect(conn, dial, nodes, settings, partitions).await
    }

    /// The store over `conn` (just opened by `dial`), with every script loaded.
    async fn finish_connect(
        conn: Conn,
        dial: Dial,
        pubsub_nodes: Vec<redis::Client>,
        settings: StoreSettings,
        partitions: usize,
    ) -> Result<Self> {
        let store = Self::over(conn, dial, pubsub_nodes, settings, partitions);
        // Loading every script now finds a broken server or script at connect time, and
        // spares the first calls a NOSCRIPT round trip.
        let mut conn = store.conn();
        for script in scripts::all() {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|err| map_err("script load", err))?;
        }
        store.check_layout().await?;
        Ok(store)
    }

    /// Records the namespace's layout (upgrading a namespace of layout 1 in place), and
    /// refuses a namespace laid out otherwise than this store would lay it out
    /// (`layout.lua`).
    ///
    /// The record is read first with a plain `HMGET`, and the script runs only when it
    /// is missing or names layout 1 and, unpartitioned, only when the namespace holds
    /// jobs: opening a new namespace writes nothing, and once a namespace is recorded a
    /// Redis user limited to key patterns needs no more than read access to the record
    /// (a script's declared keys need full access).
    async fn check_layout(&self) -> Result<()> {
        let keys = &self.inner.keys;
        let partitions = self.partition_count().to_string();
        let version = LAYOUT_VERSION.to_string();
        let recorded: (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(&keys.layout)
            .arg("partitions")
            .arg("version")
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("layout check", err))?;
        let words: Vec<String> = match recorded {
            (Some(count), Some(found)) if count == partitions && found == version => {
                vec!["ok".to_owned()]
            }
            // Unpartitioned and unrecorded: a new namespace, which has nothing to record
            // yet (so opening it, to read or to probe, writes nothing), or one of layout
            // 1, which the script records, and so upgrades.
            (None, _) if partitions == "1" && !self.holds_jobs().await? => {
                vec!["ok".to_owned()]
            }
            _ => {
                let mut invocation = scripts::LAYOUT.prepare_invoke();
                invocation
                    .key(&keys.layout)
                    .key(&keys.list)
                    .arg(&partitions)
                    .arg(&version);
                let reply = invocation
                    .invoke_async::<redis::Value>(&mut self.conn())
                    .await
                    .map_err(|err| map_err("layout check", err))?;
                redis::from_redis_value(reply).map_err(|err| map_err("layout check", err.into()))?
            }
        };
        let namespace = &self.inner.settings.namespace;
        let recorded = words.get(1).map_or("", String::as_str);
        match words.first().map(String::as_str) {
            Some("ok") => Ok(()),
            Some("partitions") => Err(Error::invalid(
                "partitions",
                format!(
                    "namespace {namespace:?} was created with {recorded} partition(s); this \
                     store opens it with {partitions}: the count is fixed when a namespace \
                     is created"
                ),
            )),
            Some("version") => Err(Error::invalid(
                "namespace",
                format!(
                    "namespace {namespace:?} is written in Redis key layout version \
                     {recorded:?}; this build reads versions 1 and {LAYOUT_VERSION} (and \
                     upgrades 1 on open; see docs/redis.md, \"Layout versions\")"
                ),
            )),
            Some("unpartitioned") => Err(Error::invalid(
                "partitions",
                format!(
                    "namespace {namespace:?} holds jobs an unpartitioned store wrote; open \
                     it with 1 partition, or create the partitioned one under a new name"
                ),
            )),
            other => Err(Error::corrupt(
                "layout check",
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// Whether an unpartitioned store has written a job in this namespace (its list
    /// index exists): one plain read.
    async fn holds_jobs(&self) -> Result<bool> {
        redis::cmd("EXISTS")
            .arg(&self.inner.keys.list)
            .query_async(&mut self.conn())
            .await
            .map_err(|err| map_err("layout check", err))
    }

    /// This store over a connection of its own, opened from the calling runtime (see
    /// `Backend::reopen`). The scripts are on the server already.
    pub(super) async fn reopened(&self) -> Result<Self> {
        let inner = &self.inner;
        let conn = inner.dial.connect().await?;
        let mut store = Self::over(
            conn,
            inner.dial.clone(),
            inner.waker.nodes().to_vec(),
            inner.settings.clone(),
            self.partition_count(),
        );
        if let Some(partitions) = &inner.partitions {
            store.claim_only(partitions.claimed().to_vec());
        }
        Ok(store)
    }

    /// Pins the claims of a store just opened (its `Inner` not shared yet) to
    /// `partitions`, already checked.
    fn claim_only(&mut self, partitions: Vec<usize>) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            if let Some(all) = &mut inner.partitions {
                all.claim_only(partitions);
            }
        }
    }

    /// The store of namespace `settings.namespace` over `conn`: one store, or for
    /// `partitions > 1` a store of the namespace's own slot holding one store per
    /// partition, all over the same connection and one wake-up subscriber. Subscriber
    /// and batchers start on first use.
    fn over(
        conn: Conn,
        dial: Dial,
        pubsub_nodes: Vec<redis::Client>,
        settings: StoreSettings,
        partitions: usize,
    ) -> Self {
        let namespace = settings.namespace.clone();
        let shared = Shared {
            conn,
            dial,
            settings,
            partitioned: partitions > 1,
        };
        if partitions <= 1 {
            let heads = Arc::new(Heads::default());
            let seeded = Arc::clone(&heads);
            let seed: Seed = Arc::new(move |queue: &str, ids: &str| seeded.seed(queue, ids));
            return Self::part(
                &shared,
                pubsub_nodes,
                Keys::new(&namespace),
                heads,
                seed,
                None,
            );
        }
        let parts: Vec<RedisBackend> = (0..partitions)
            .map(|partition| {
                // A partition never waits for work itself: its wake-ups reach the
                // subscriber of the store that holds it, which seeds its claims.
                let ignored: Seed = Arc::new(|_: &str, _: &str| {});
                let keys = Keys::partition(&namespace, partition, partitions);
                Self::part(&shared, Vec::new(), keys, Arc::default(), ignored, None)
            })
            .collect();
        let heads: Vec<Arc<Heads>> = parts
            .iter()
            .map(|part| Arc::clone(&part.inner.heads))
            .collect();
        // A wake-up names the ids one enqueue script made ready, all of one partition.
        let seed: Seed = Arc::new(move |queue: &str, ids: &str| {
            let first = ids.split(' ').next().unwrap_or_default();
            if let Ok(id) = JobId::parse_canonical(first.as_bytes()) {
                heads[crate::partitions::of_id(id, heads.len())].seed(queue, ids);
            }
        });
        let keys = Keys::new(&namespace);
        let partitions = Some(Partitions::new(parts));
        Self::part(
            &shared,
            pubsub_nodes,
            keys,
            Arc::default(),
            seed,
            partitions,
        )
    }

    /// One store over `keys`: a namespace's, or one partition's.
    fn part(
        shared: &Shared,
        pubsub_nodes: Vec<redis::Client>,
        keys: Keys,
        heads: Arc<Heads>,
        seed: Seed,
        partitions: Option<Partitions>,
    ) -> Self {
        let Shared {
            conn,
            dial,
            settings,
            partitioned,
        } = shared.clone();
        let waker = Waker::new(pubsub_nodes, keys.wake.clone(), seed);
        let completion_graphs = crate::store::lease::GraphHint::default();
        let completions = Batcher::new(Completions {
            conn: conn.clone(),
            keys: keys.clone(),
            graphs: completion_graphs.clone(),
        });
        let window = settings.dedup_window;
        let enqueue_ctx = EnqueueCtx {
            conn: conn.clone(),
            keys: keys.clone(),
            window,
            dedup_ttl: if window.is_zero() { 0 } else { ttl_ms(window) },
            // A partition is a store of its own inside a partitioned one (its keys
            // tagged `{NS#p}`); neither declares `Events` (CONTRACT §8), so neither
            // marks its jobs.
            record_events: settings.records_events() && !partitioned,
        };
        let enqueues = Batcher::new(Enqueues {
            ctx: enqueue_ctx.clone(),
        });
        RedisBackend {
            inner: Arc::new(Inner {
                cluster: matches!(dial, Dial::Cluster(..)),
                conn,
                dial,
                settings,
                keys,
                heads,
                waker,
                completions,
                completion_graphs,
                enqueues,
                enqueue_ctx,
                limited: Default::default(),
                start_sweep: Default::default(),
                partitions,
            }),
        }
    }
}

/// What every store of one open shares: the connection, how it was opened, the
/// settings, and whether the namespace is partitioned.
#[derive(Clone)]
struct Shared {
    conn: Conn,
    dial: Dial,
    settings: StoreSettings,
    partitioned: bool,
}

/// The key layout this build writes, recorded per namespace (`layout.lua`). It also
/// reads layout 1, and upgrades a namespace of it on open.
const LAYOUT_VERSION: u32 = 2;

/// `url` without its `partitions` query parameter, and that parameter's value. The
/// Redis driver is given the URL without it.
fn take_partitions(url: &str) -> Result<(String, Option<usize>)> {
    let Some((base, rest)) = url.split_once('?') else {
        return Ok((url.to_owned(), None));
    };
    let (query, fragment) = match rest.split_once('#') {
        Some((query, fragment)) => (query, Some(fragment)),
        None => (rest, None),
    };
    let mut found = None;
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        match pair.split_once('=') {
            Some(("partitions", value)) => {
                let count = value.parse::<usize>().map_err(|_| {
                    Error::invalid(
                        "url",
                        format!("partitions={value:?} is not a whole number of partitions"),
                    )
                })?;
                found = Some(count);
            }
            _ => kept.push(pair),
        }
    }
    let mut rebuilt = base.to_owned();
    if !kept.is_empty() {
        rebuilt.push('?');
        rebuilt.push_str(&kept.join("&"));
    }
    if let Some(fragment) = fragment {
        rebuilt.push('#');
        rebuilt.push_str(fragment);
    }
    Ok((rebuilt, found))
}

/// A pin of the claims to `pinned` partitions of `count` is usable: at least one,
/// none twice, each one the namespace has.
fn check_claim_partitions(pinned: Option<&[usize]>, count: usize) -> Result<()> {
    let Some(pinned) = pinned else {
        return Ok(());
    };
    let field = "claim_partitions";
    if pinned.is_empty() {
        return Err(Error::invalid(field, "name at least one partition"));
    }
    if let Some(beyond) = pinned.iter().find(|p| **p >= count) {
        return Err(Error::invalid(
            field,
            format!("partition {beyond} of a namespace of {count} (numbered from 0)"),
        ));
    }
    let mut seen = pinned.to_vec();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != pinned.len() {
        return Err(Error::invalid(field, "a partition named twice"));
    }
    Ok(())
}

/// The partition count of an open: the one set on the config, else the URLs' (which
/// must agree), else 1; refused outside 1..=MAX_PARTITIONS.
fn partition_count(
    set: Option<usize>,
    in_urls: impl IntoIterator<Item = Option<usize>>,
) -> Result<usize> {
    let mut from_urls = None;
    for count in in_urls.into_iter().flatten() {
        if from_urls.is_some_and(|seen| seen != count) {
            return Err(Error::invalid(
                "url",
                "the node URLs name different partition counts",
            ));
        }
        from_urls = Some(count);
    }
    if let (Some(set), Some(in_url)) = (set, from_urls) {
        if set != in_url {
            return Err(Error::invalid(
                "partitions",
                format!("set to {set}, but the URL says partitions={in_url}"),
            ));
        }
    }
    let count = set.or(from_urls).unwrap_or(1);
    if !(1..=MAX_PARTITIONS).contains(&count) {
        return Err(Error::invalid(
            "partitions",
            format!("{count} partitions: a namespace has 1 to {MAX_PARTITIONS}"),
        ));
    }
    Ok(count)
}

/// How a store's connection is opened: kept, so the store can open another one.
#[derive(Clone)]
pub(super) enum Dial {
    /// One server: a connection that reconnects by itself.
    Single(Box<redis::Client>),
    /// A cluster, through its nodes; and the addresses of the nodes it was given, for
    /// errors.
    Cluster(Box<redis::cluster::ClusterClient>, Arc<str>),
}

impl Dial {
    /// A connection, or an error that names the server (or the cluster's nodes) and
    /// the cause: "redis connect to 127.0.0.1:6379: Connection refused (os error 111)".
    async fn connect(&self) -> Result<Conn> {
        let failed = |err: redis::RedisError| {
            let server = match self {
                Dial::Single(client) => client.get_connection_info().addr().to_string(),
                Dial::Cluster(_, nodes) => format!("the cluster of {nodes}"),
            };
            map_err(&format!("connect to {server}: {err}"), err)
        };
        match self {
            Dial::Single(client) => {
                // A lost connection is replaced by a series of attempts, the pauses
                // between them doubling from RECONNECT_FIRST_DELAY to RECONNECT_CAP: the
                // driver adds up to as much again as jitter, so its own cap is half of
                // ours. The calls made meanwhile wait for the series (see `Conn`).
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(CONNECT_TIMEOUT))
                    .set_response_timeout(Some(RESPONSE_TIMEOUT))
                    .set_min_delay(RECONNECT_FIRST_DELAY)
                    .set_exponent_base(2.0)
                    .set_max_delay(RECONNECT_CAP / 2)
                    .set_number_of_retries(RECONNECT_RETRIES);
                ConnectionManager::new_with_config((**client).clone(), config)
                    .await
                    .map(Conn::Single)
                    .map_err(failed)
            }
            Dial::Cluster(client, _) => client
                .get_async_connection()
                .await
                .map(Conn::Cluster)
                .map_err(failed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_urls_are_told_by_their_scheme() {
        assert!(is_tls_url("rediss://127.0.0.1:6380"));
        assert!(is_tls_url("REDISS://host/#insecure"));
        assert!(is_tls_url("valkeys://host"));
        assert!(!is_tls_url("redis://host"));
        assert!(!is_tls_url("redis://user:rediss://@host"));
        assert!(!is_tls_url("not a url"));
    }

    /// Without the feature a rediss:// URL is refused at once, saying which feature it
    /// needs; with it, the URL is read (connecting is for the TLS test).
    #[test]
    fn rediss_urls_need_the_tls_feature() {
        let outcome = node_client("rediss://127.0.0.1:6380", None);
        if cfg!(feature = "tls") {
            assert!(outcome.is_ok(), "{outcome:?}");
        } else {
            let err = outcome.expect_err("no TLS built in");
            assert_eq!(err.invalid_field(), Some("url"));
            assert!(err.to_string().contains("`tls` feature"), "{err}");
        }
    }

    #[cfg(feature = "tls")]
    #[test]
    fn certificates_need_a_tls_url_and_must_parse() {
        let tls = TlsConfig::new().root_ca_pem("not a certificate");
        let err = node_client("redis://127.0.0.1:6379", Some(&tls)).expect_err("plain URL");
        assert_eq!(err.invalid_field(), Some("url"));
        let err = node_client("rediss://127.0.0.1:6380", Some(&tls)).expect_err("bad PEM");
        assert_eq!(err.invalid_field(), Some("tls"), "{err}");
        assert!(!format!("{tls:?}").contains("not a certificate"));
    }

    #[test]
    fn the_partitions_parameter_is_taken_out_of_the_url() {
        let take = |url: &str| take_partitions(url).expect("parses");
        assert_eq!(take("redis://h:6379"), ("redis://h:6379".to_owned(), None));
        assert_eq!(
            take("redis://h:6379/?partitions=12"),
            ("redis://h:6379/".to_owned(), Some(12))
        );
        assert_eq!(
            take("redis://h/0?protocol=resp3&partitions=3#insecure"),
            ("redis://h/0?protocol=resp3#insecure".to_owned(), Some(3))
        );
        assert_eq!(
            take("redis://h/?a=1&partitions=2&b=2"),
            ("redis://h/?a=1&b=2".to_owned(), Some(2))
        );
        let err = take_partitions("redis://h/?partitions=twelve").expect_err("not a number");
        assert_eq!(err.invalid_field(), Some("url"));
        assert!(err.to_string().contains("twelve"), "{err}");
    }

    #[test]
    fn the_partition_count_comes_from_the_config_or_the_urls_and_must_agree() {
        assert_eq!(partition_count(None, [None]).expect("default"), 1);
        assert_eq!(partition_count(Some(12), [None]).expect("set"), 12);
        assert_eq!(
            partition_count(None, [Some(4), None, Some(4)]).expect("urls"),
            4
        );
        assert_eq!(partition_count(Some(4), [Some(4)]).expect("agree"), 4);
        let refused = [
            partition_count(Some(3), [Some(4)]),
            partition_count(None, [Some(3), Some(4)]),
            partition_count(Some(0), [None]),
            partition_count(Some(MAX_PARTITIONS + 1), [None]),
        ];
        for outcome in refused {
            let err = outcome.expect_err("refused");
            assert!(
                matches!(err.invalid_field(), Some("partitions" | "url")),
                "{err}"
            );
        }
    }
}
