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
    Ok(ClientBuilder::try_from(config)?
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

impl<S> tower_layer::Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;
    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted {
            inner,
            limiter: self.limiter.clone(),
            wait: None,
            granted: false,
        }
    }
}

/// The service: ready only once a token is granted (kube's client calls
/// `poll_ready` before each `call`, one request at a time).
pub struct Budgeted<S> {
    inner: S,
    limiter: Arc<DefaultDirectRateLimiter>,
    wait: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    granted: bool,
}

impl<S, R> tower_service::Service<R> for Budgeted<S>
where
    S: tower_service::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if !self.granted {
            if self.limiter.check().is_ok() {
                self.granted = true;
            } else {
                let limiter = self.limiter.clone();
                let wait = self
                    .wait
                    .get_or_insert_with(|| Box::pin(async move { limiter.until_ready().await }));
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
                self.granted = true;
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: R) -> Self::Future {
        self.granted = false;
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;
    use tower_layer::Layer;
    use tower_service::Service;

    struct Echo;
    impl Service<u32> for Echo {
        type Response = u32;
        type Error = ();
        type Future = std::future::Ready<Result<u32, ()>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, r: u32) -> Self::Future {
            std::future::ready(Ok(r))
        }
    }

    /// `burst` requests go at once; the next one waits for a token (here a
    /// thousand seconds away), and a request is never sent without one.
    #[test]
    fn holds_requests_beyond_the_burst() {
        let budget = Budget {
            qps: 0.001,
            burst: 5,
        };
        let mut svc = BudgetLayer::new(budget).layer(Echo);
        let mut cx = Context::from_waker(Waker::noop());
        for i in 0..5 {
            assert!(svc.poll_ready(&mut cx).is_ready(), "request {i}");
            drop(svc.call(i));
        }
        assert!(svc.poll_ready(&mut cx).is_pending());
        assert!(svc.poll_ready(&mut cx).is_pending(), "still no token");
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
