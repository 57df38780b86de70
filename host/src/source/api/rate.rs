//! --kube-api-qps and --kube-api-burst: a token bucket in front of every
//! request the client sends, as client-go's rate limiter is (a long watch
//! costs one token when it starts).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Tokens refill at `qps` per second up to `burst`.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    qps: f64,
    burst: f64,
}

impl Limit {
    /// None when `qps` is 0 (no limit).
    pub fn new(qps: f32, burst: u32) -> Option<Limit> {
        (qps > 0.0).then(|| Limit { qps: f64::from(qps), burst: f64::from(burst.max(1)) })
    }
}

impl<S> tower::Layer<S> for Limit {
    type Service = Limited<S>;
    fn layer(&self, inner: S) -> Limited<S> {
        Limited { inner, bucket: Bucket::new(*self, Instant::now()), wait: None }
    }
}

/// The bucket's arithmetic, apart from time and I/O.
#[derive(Debug)]
struct Bucket {
    limit: Limit,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn new(limit: Limit, now: Instant) -> Bucket {
        Bucket { limit, tokens: limit.burst, at: now }
    }

    /// Takes a token, or says how long until one is there.
    fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.limit.qps).min(self.limit.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.limit.qps))
        }
    }
}

pub struct Limited<S> {
    inner: S,
    bucket: Bucket,
    wait: Option<Pin<Box<Sleep>>>,
}

impl<S, R> tower::Service<R> for Limited<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        loop {
            if let Some(wait) = &mut self.wait {
                if wait.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.wait = None;
            }
            match self.bucket.take(Instant::now()) {
                Ok(()) => return self.inner.poll_ready(cx),
                Err(d) => self.wait = Some(Box::pin(tokio::time::sleep(d))),
            }
        }
    }

    fn call(&mut self, req: R) -> S::Future {
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_qps() {
        let t0 = Instant::now();
        let mut b = Bucket::new(Limit::new(5.0, 3).unwrap(), t0);
        for _ in 0..3 {
            assert_eq!(b.take(t0), Ok(()));
        }
        let wait = b.take(t0).unwrap_err();
        assert!((wait.as_secs_f64() - 0.2).abs() < 1e-9, "{wait:?}");
        assert_eq!(b.take(t0 + Duration::from_millis(200)), Ok(()));
        // Idle time refills up to the burst only.
        let later = t0 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(b.take(later), Ok(()));
        }
        assert!(b.take(later).is_err());
        assert!(Limit::new(0.0, 10).is_none());
    }
}
