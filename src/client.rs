//! The janitor's Kubernetes client: found as kubectl finds it, with a
//! client-side budget on every request it makes (`--api-qps`, `--api-burst`),
//! as client-go's token bucket does. Watches count once, when they start.

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::client::ClientBuilder;
use kube::{Client, Config};

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

/// Builds a client from the kubeconfig / in-cluster config, within `budget`.
pub async fn build(budget: Budget) -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    budgeted(config, budget)
}

/// The client for the janitor's own control traffic, outside the budget:
/// the leader Lease (a leader must not lose its lease because reclaims
/// saturate the budget, as kube-controller-manager gives leader election a
/// client of its own) and the one-time start-up check.
pub async fn control() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    Client::try_from(config)
}

fn budgeted(config: Config, budget: Budget) -> Result<Client, kube::Error> {
    Ok(ClientBuilder::try_from(config)?
        // A buffer of our own, so that requests wait for the budget side
        // by side rather than in one line (a DELETE must not queue behind).
        .with_layer(&tower::buffer::BufferLayer::new(1024))
        .with_layer(&BudgetLayer::new(budget))
        .build())
}

/// A tower layer that holds each request until the budget has a token.
#[derive(Clone)]
pub struct BudgetLayer {
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl BudgetLayer {
    pub fn new(budget: Budget) -> Self {
        BudgetLayer {
            limiter: Arc::new(RateLimiter::direct(budget.quota())),
        }
    }
}

impl<S> tower::Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;
    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted {
            inner,
            limiter: self.limiter.clone(),
        }
    }
}

/// The service. Every read (GET, LIST, WATCH) waits for a token. A write
/// does not: the janitor writes only right after it checked what allows the
/// write (the holder read before a DELETE, the leader deadline before an
/// Event or a label patch), and a write that waited in a queue could leave
/// after that check stopped being true (a pod recreated under the holder's
/// name, a lease lost). A write takes a token when one is free; writes are
/// bounded by the locks that change (a DELETE and an Event per reclaim).
#[derive(Clone)]
pub struct Budgeted<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
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
        let write = !matches!(*req.method(), http::Method::GET | http::Method::HEAD);
        Box::pin(async move {
            if write {
                let _ = limiter.check();
            } else {
                limiter.until_ready().await;
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
    use tower::{Layer, Service, ServiceExt};

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
        let svc = BudgetLayer::new(budget).layer(counter.clone());
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
