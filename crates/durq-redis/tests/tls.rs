//! TLS (feature `tls`, issue #12): a redis-server of the test's own that speaks only
//! TLS, with a certificate signed by a CA the test generates. The store connects over
//! `rediss://` trusting that CA, and then with a client certificate once the server asks
//! for one; a store trusting only the system's roots is refused.
//!
//! Needs `redis-server` built with TLS on the PATH: skipped loudly when it is missing or
//! refuses `--tls-port`, failing instead when `JOBS_REQUIRE_SERVICES=1`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use durq_core::{ClaimRequest, JobState, ManualClock, NewJob, Store, StoreSettings};
use durq_redis::{RedisBackend, RedisConfig, TlsConfig};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A CA, and a server and a client certificate it signed, all PEM.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

fn pki() -> Pki {
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "durq-redis test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().expect("CA key");
    let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
    let issuer = Issuer::new(ca, ca_key);

    // The store dials 127.0.0.1, so the server's name is that IP address.
    let leaf = |names: Vec<String>, purpose: ExtendedKeyUsagePurpose| {
        let mut params = CertificateParams::new(names).expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, "durq-redis test");
        params.extended_key_usages = vec![purpose];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &issuer).expect("leaf certificate");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(
        vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = leaf(
        vec!["client".to_owned()],
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    Pki {
        ca: ca_cert.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    }
}

/// A port nothing listens on now: bound by the OS, then released for the server.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// A redis-server listening only on a TLS port, killed and its directory removed when
/// dropped (even when the test panics).
struct TlsServer {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl TlsServer {
    /// `None` (skipped loudly, or failing under JOBS_REQUIRE_SERVICES=1) when
    /// redis-server is missing or cannot serve TLS. With `cluster`, the server is a
    /// cluster node whose bus speaks TLS too, owning no slot yet.
    async fn start(pki: &Pki, cluster: bool) -> Option<TlsServer> {
        let port = free_port();
        let dir =
            std::env::temp_dir().join(format!("durq-redis-tls-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write a PEM file");
            path
        };
        let ca = file("ca.pem", &pki.ca);
        let cert = file("server.pem", &pki.server_cert);
        let key = file("server-key.pem", &pki.server_key);
        let log = dir.join("redis.log");
        let spawned = Command::new("redis-server")
            .args(["--port", "0"])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--tls-ca-cert-file")
            .arg(&ca)
            .args(["--tls-auth-clients", "no"])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(if cluster {
                vec![
                    "--cluster-enabled".to_owned(),
                    "yes".to_owned(),
                    "--tls-cluster".to_owned(),
                    "yes".to_owned(),
                    "--cluster-port".to_owned(),
                    free_port().to_string(),
                    "--cluster-config-file".to_owned(),
                    dir.join("nodes.conf").display().to_string(),
                ]
            } else {
                Vec::new()
            })
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(err) => {
                let _ = std::fs::remove_dir_all(&dir);
                return durq_conformance::skip_or_fail("redis-server (binary)", "PATH", &err);
            }
        };
        let mut server = TlsServer { child, port, dir };
        // Waiting for a process to start listening, not for an expiry.
        for _ in 0..500 {
            if let Ok(Some(status)) = server.child.try_wait() {
                // A build without TLS refuses the options and exits.
                let mut said = String::new();
                if let Some(mut stderr) = server.child.stderr.take() {
                    use std::io::Read as _;
                    let _ = stderr.read_to_string(&mut said);
                }
                said.push_str(&std::fs::read_to_string(&log).unwrap_or_default());
                let why = format!("redis-server --tls-port exited ({status}): {}", said.trim());
                return durq_conformance::skip_or_fail("redis-server with TLS", "PATH", &why);
            }
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(server);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server on TLS port {port} did not come up");
    }

    fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// A connection of the test's own, trusting the test's CA.
    async fn admin(&self, pki: &Pki) -> redis::aio::MultiplexedConnection {
        let certificates = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: pki.client_cert.clone().into_bytes(),
                client_key: pki.client_key.clone().into_bytes(),
            }),
            root_cert: Some(pki.ca.clone().into_bytes()),
        };
        redis::Client::build_with_tls(self.url().as_str(), certificates)
            .expect("admin client")
            .get_multiplexed_async_connection()
            .await
            .expect("admin connection")
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn settings(clock: &ManualClock) -> StoreSettings {
    StoreSettings::default()
        .namespace("tls")
        .clock(Arc::new(clock.clone()))
}

/// Enqueues a job and runs it to success through `store`: proof that scripts, reads
/// and the completion grouper all work over the connection.
async fn round_trip(store: &Store, queue: &str) {
    let id = store
        .enqueue(NewJob::new(queue).payload(&b"over tls"[..]))
        .await
        .expect("enqueue over TLS")
        .id;
    let claimed = store
        .claim_one(&[queue], "w", Duration::from_secs(30))
        .await
        .expect("claim over TLS")
        .expect("the job just enqueued");
    assert_eq!(claimed.id(), id);
    assert_eq!(&claimed.payload[..], b"over tls");
    store
        .complete(id, claimed.token(), None)
        .await
        .expect("complete over TLS");
    assert_eq!(store.get(id).await.expect("get").state, JobState::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_connects_trusting_the_servers_ca_and_with_a_client_certificate() {
    let pki = pki();
    let Some(server) = TlsServer::start(&pki, false).await else {
        return;
    };
    let clock = ManualClock::default();

    // The system's roots do not know the test's CA: the handshake fails, and the
    // connect says so instead of handing out a store that cannot work.
    let err = RedisBackend::connect(&server.url(), settings(&clock))
        .await
        .expect_err("a certificate from an unknown CA must be refused");
    let cause = std::error::Error::source(&err)
        .map(|s| s.to_string())
        .unwrap_or_default();
    assert!(
        cause.to_lowercase().contains("certificate"),
        "refused for another reason than the certificate: {err:?}"
    );

    let trusted = TlsConfig::new().root_ca_pem(pki.ca.clone());
    let redis = RedisConfig::new(server.url())
        .tls(trusted.clone())
        .open(settings(&clock))
        .await
        .expect("connect trusting the test CA");
    let store = Store::new(redis.clone());
    round_trip(&store, "q").await;

    // Wake-ups ride a pub/sub connection of their own, with the same certificates.
    assert!(
        redis.wake_ready(Duration::from_secs(10)).await,
        "the wake-up subscriber did not subscribe over TLS"
    );
    let waiter = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .wait_for_work(&["woken".to_owned()], Duration::from_secs(60))
                .await
        })
    };
    while redis.waiting_for_work() == 0 {
        tokio::task::yield_now().await;
    }
    store.enqueue(NewJob::new("woken")).await.expect("enqueue");
    tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not woken over TLS")
        .expect("join")
        .expect("wait_for_work");

    // Mutual TLS: once the server asks for client certificates, only a store that
    // presents one signed by the CA gets in.
    let mut admin = server.admin(&pki).await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("tls-auth-clients")
        .arg("yes")
        .query_async(&mut admin)
        .await
        .expect("CONFIG SET tls-auth-clients yes");
    let refused = async {
        let store = Store::new(
            RedisConfig::new(server.url())
                .tls(trusted.clone())
                .open(settings(&clock))
                .await?,
        );
        store.stats("q").await
    }
    .await;
    let refused = refused.expect_err("a client without a certificate got in");
    assert!(
        format!("{refused:?}").contains("CertificateRequired"),
        "refused for another reason than the missing certificate: {refused:?}"
    );
    let with_cert = trusted.client_auth_pem(pki.client_cert.clone(), pki.client_key.clone());
    let store = Store::new(
        RedisConfig::new(server.url())
            .tls(with_cert)
            .open(settings(&clock))
            .await
            .expect("connect with a client certificate"),
    );
    round_trip(&store, "mutual").await;
    let stats = store.stats("q").await.expect("stats");
    assert_eq!(stats.succeeded, 1);
    assert_eq!(
        store
            .claim(ClaimRequest::new(["woken"], "w", Duration::from_secs(30)))
            .await
            .expect("claim")
            .len(),
        1
    );
    drop(server);
}

/// A Redis Cluster over TLS (client connections and the cluster bus): one node owning
/// every slot, which is all the cluster client needs to find its way (it reads the
/// slots, then dials the node they name with the store's certificates).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_cluster_connects_with_the_callers_ca() {
    let pki = pki();
    let Some(server) = TlsServer::start(&pki, true).await else {
        return;
    };
    let mut admin = server.admin(&pki).await;
    let () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query_async(&mut admin)
        .await
        .expect("CLUSTER ADDSLOTSRANGE");
    // Waiting for the node to declare its cluster up, not for an expiry.
    let mut up = false;
    for _ in 0..500 {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut admin)
            .await
            .expect("CLUSTER INFO");
        if info.contains("cluster_state:ok") {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(up, "the one-node cluster did not come up");

    let clock = ManualClock::default();
    let err = RedisConfig::cluster([server.url()])
        .open(settings(&clock))
        .await
        .expect_err("a certificate from an unknown CA must be refused");
    assert!(
        format!("{err:?}").to_lowercase().contains("certificate"),
        "refused for another reason than the certificate: {err:?}"
    );
    let redis = RedisConfig::cluster([server.url()])
        .tls(TlsConfig::new().root_ca_pem(pki.ca.clone()))
        .open(settings(&clock))
        .await
        .expect("connect to the cluster trusting the test CA");
    assert!(
        redis.wake_ready(Duration::from_secs(10)).await,
        "the wake-up subscriber did not subscribe over TLS"
    );
    round_trip(&Store::new(redis), "q").await;
    drop(server);
}
