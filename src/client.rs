//! The janitor's Kubernetes client: found as kubectl finds it, with a
//! client-side budget on every request it makes (`--api-qps`, `--api-burst`),
//! as client-go's token bucket does. Watches count once, when they start.
//! Every request, budgeted or not, is counted by verb and answer
//! (`lock_janitor_api_requests_total`), and the time a read waited for the
//! budget is observed (`lock_janitor_api_budget_wait_seconds`).

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::client::ClientBuilder;
use kube::{Client, Config};
use tower::layer::{layer_fn, Layer};

use crate::metrics::Metrics;

/// Requests per second on average, and how many may go at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Budget {
    pub qps: f64,
    pub burst: u32,
}

impl Budget {
    fn quota(self) -> Quota {
        let burst = NonZeroU32::new(self.burst.max(1)).unwrap_or(NonZeroU32::MIN);
        // One token every 1/qps seconds, up to `burst` saved.
        let period = std::time::Duration::from_secs_f64(1.0 / self.qps.max(0.001));
        Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst)
    }
}

/// The kubeconfig / in-cluster config, found as kubectl finds it; read
/// once, each client built from a copy.
pub async fn config() -> Result<Config, kube::Error> {
    Config::infer().await.map_err(kube::Error::InferConfig)
}

/// The client outside the budget: the janitor's own control traffic (the
/// leader Lease: a leader must not lose its lease because reclaims saturate
/// the budget, as kube-controller-manager gives leader election a client of
/// its own; the one-time start-up check), and every judgement's live reads
/// and its guarded write (a lock's GET, its holder's GET or, for a Lease,
/// the pods its identity could name; the DELETE or release and its Event),
/// so a death is acted on at once. The budget paces the janitor's own
/// schedule: the watches' lists, the sweeps and the admin commands. The
/// takeover followers keep to a budget of their own.
pub fn control(config: Config, metrics: &Metrics) -> Result<Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&counted(metrics))
        .build())
}

/// A client within `budget`.
pub fn build(config: Config, budget: Budget, metrics: &Metrics) -> Result<Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        // A buffer of our own, so that requests wait for the budget side
        // by side rather than in one line (a DELETE must not queue behind).
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&budgeted_by(budget, Some(metrics.api_budget_wait.clone())))
        .with_layer(&counted(metrics))
        .build())
}

/// The verb of a request as the API server's audit log names it, from its
/// method and query (`list` and `get` are told apart by the path: a
/// collection has an even number of segments after the group/version).
pub fn verb_of<B>(req: &http::Request<B>) -> &'static str {
    let watch = req
        .uri()
        .query()
        .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
    match *req.method() {
        http::Method::GET if watch => "watch",
        http::Method::GET | http::Method::HEAD => {
            // /api/v1/namespaces/ns/pods (list) vs .../pods/name (get).
            let segs: Vec<&str> = req
                .uri()
                .path()
                .split('/')
                .filter(|s| !s.is_empty())
                .collect();
            let after = match segs.first() {
                Some(&"api") => 2,
                Some(&"apis") => 3,
                _ => return "get",
            };
            let rest = segs.len().saturating_sub(after);
            let namespaced = segs.get(after) == Some(&"namespaces") && rest >= 3;
            let resource_segs = if namespaced { rest - 2 } else { rest };
            if resource_segs == 1 {
                "list"
            } else {
                "get"
            }
        }
        http::Method::POST => "create",
        http::Method::PUT => "update",
        http::Method::PATCH => "patch",
        http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// Counts every request by verb and answer code.
fn counted<S>(metrics: &Metrics) -> impl Layer<S, Service = Counted<S>> {
    let requests = metrics.api_requests.clone();
    layer_fn(move |inner| Counted {
        inner,
        requests: requests.clone(),
    })
}

#[derive(Clone)]
struct Counted<S> {
    inner: S,
    requests: prometheus::IntCounterVec,
}

impl<S, B, RB> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let verb = verb_of(&req);
        let requests = self.requests.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let answer = fut.await;
            let code = match &answer {
                Ok(r) => r.status().as_u16().to_string(),
                // No answer: a transport error or a timeout.
                Err(_) => "none".to_owned(),
            };
            requests.with_label_values(&[verb, &code]).inc();
            answer
        })
    }
}

/// A tower layer that holds each request until the budget has a token,
/// observing how long each read waited in `waited`
/// (`lock_janitor_api_budget_wait_seconds`).
fn budgeted_by<S>(
    budget: Budget,
    waited: Option<prometheus::Histogram>,
) -> impl Layer<S, Service = Budgeted<S>> {
    let limiter = Arc::new(RateLimiter::direct(budget.quota()));
    layer_fn(move |inner| Budgeted {
        inner,
        limiter: limiter.clone(),
        waited: waited.clone(),
    })
}

/// The service. Every read (GET, LIST, WATCH) waits for a token. A write
/// does not: the janitor writes only right after it checked what allows the
/// write (the holder read before a DELETE, the leader deadline before an
/// Event or a label patch), and a write that waited in a queue could leave
/// after that check stopped being true (a pod recreated under the holder's
/// name, a lease lost). A write takes a token when one is free; writes are
/// bounded by the locks that change (a DELETE and an Event per reclaim).
#[derive(Clone)]
struct Budgeted<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    waited: Option<prometheus::Histogram>,
}

impl<S, B> tower::Service<http::Request<B>> for Budgeted<S>
where
    S: tower::Service<http::Request<B>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is awaited per request, after its token.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        use tower::ServiceExt;
        let inner = self.inner.clone();
        let limiter = self.limiter.clone();
        let waited = self.waited.clone();
        let write = !matches!(*req.method(), http::Method::GET | http::Method::HEAD);
        Box::pin(async move {
            if write {
                let _ = limiter.check();
            } else {
                let start = std::time::Instant::now();
                limiter.until_ready().await;
                if let Some(h) = &waited {
                    h.observe(start.elapsed().as_secs_f64());
                }
            }
            inner.oneshot(req).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Service, ServiceExt};

    /// Answers at once and counts what reached it.
    #[derive(Clone, Default)]
    struct Counter(Arc<AtomicUsize>);
    impl Service<http::Request<()>> for Counter {
        type Response = ();
        type Error = std::convert::Infallible;
        type Future = std::future::Ready<Result<(), Self::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok(()))
        }
    }

    fn req(method: http::Method) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri("/api")
            .body(())
            .unwrap()
    }

    /// `burst` reads go at once; the next one waits for a token (here a
    /// thousand seconds away) and never reaches the server without one; a
    /// write (DELETE, POST, PATCH) does not wait behind it.
    #[tokio::test]
    async fn holds_reads_beyond_the_burst_but_never_a_write() {
        let budget = Budget {
            qps: 0.001,
            burst: 5,
        };
        let counter = Counter::default();
        let svc = budgeted_by(budget, None).layer(counter.clone());
        for _ in 0..5 {
            svc.clone().oneshot(req(http::Method::GET)).await.unwrap();
        }
        assert_eq!(counter.0.load(Ordering::SeqCst), 5);
        let mut waiting = svc.clone().oneshot(req(http::Method::GET)).boxed();
        assert!(
            (&mut waiting).now_or_never().is_none(),
            "no token: it waits"
        );
        assert_eq!(counter.0.load(Ordering::SeqCst), 5, "and was not sent");
        svc.clone()
            .oneshot(req(http::Method::DELETE))
            .await
            .unwrap();
        assert_eq!(
            counter.0.load(Ordering::SeqCst),
            6,
            "the DELETE went through"
        );
        assert!(waiting.now_or_never().is_none(), "the GET still waits");
    }

    #[test]
    fn verbs_as_the_audit_log_names_them() {
        let r = |m: http::Method, uri: &str| {
            http::Request::builder()
                .method(m)
                .uri(uri)
                .body(())
                .unwrap()
        };
        use http::Method as M;
        for (m, uri, want) in [
            (M::GET, "/api/v1/namespaces/ns/pods/p", "get"),
            (M::GET, "/api/v1/namespaces/ns/pods?fieldSelector=x", "list"),
            (M::GET, "/api/v1/pods?limit=500", "list"),
            (
                M::GET,
                "/api/v1/namespaces/ns/configmaps?watch=true&labelSelector=a",
                "watch",
            ),
            (
                M::GET,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                "get",
            ),
            (M::GET, "/apis/coordination.k8s.io/v1/leases", "list"),
            (M::GET, "/api/v1/nodes/n", "get"),
            (M::GET, "/api/v1/namespaces/ns", "get"),
            (M::GET, "/api/v1/namespaces", "list"),
            (M::DELETE, "/api/v1/namespaces/ns/configmaps/c", "delete"),
            (
                M::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l",
                "update",
            ),
            (M::PATCH, "/api/v1/namespaces/ns/configmaps/c", "patch"),
            (
                M::POST,
                "/apis/events.k8s.io/v1/namespaces/ns/events",
                "create",
            ),
        ] {
            assert_eq!(verb_of(&r(m, uri)), want, "{uri}");
        }
    }

    #[test]
    fn quota_matches_the_flags() {
        let q = Budget {
            qps: 20.0,
            burst: 40,
        }
        .quota();
        assert_eq!(q.burst_size().get(), 40);
        assert_eq!(q.replenish_interval(), std::time::Duration::from_millis(50));
    }
}
