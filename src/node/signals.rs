//! The one signal module. Stopping cleanly (activate, join-service, reprovision, a queued
//! reboot): SIGTERM/SIGINT only set a flag (all a signal handler may safely do); a supervising
//! thread turns it into a `Stop` request, which wakes every thread waiting on it. Or, for the
//! hook once its work is done, exit 0.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// Route SIGTERM and SIGINT to `signalled()`.
pub(crate) fn catch_sigterm() {
    extern "C" fn on_signal(_: libc::c_int) {
        SIGNALLED.store(true, Ordering::SeqCst);
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { install(on_signal) }
}

/// Exit 0 on SIGTERM and SIGINT. As PID 1 of a container (the hook) the default action of
/// SIGTERM is to ignore it; install this only once the work is done, so that a signal never
/// ends a half-done run as a success.
pub(crate) fn exit_on_sigterm() {
    extern "C" fn on_signal(_: libc::c_int) {
        // Async-signal-safe; stdout is line-buffered and the summary line is already out.
        unsafe { libc::_exit(0) }
    }
    // SAFETY: the handler only calls _exit, which is async-signal-safe.
    unsafe { install(on_signal) }
}

/// # Safety
/// `handler` may only do what is async-signal-safe.
unsafe fn install(handler: extern "C" fn(libc::c_int)) {
    let handler = handler as libc::sighandler_t;
    for sig in [libc::SIGTERM, libc::SIGINT] {
        if unsafe { libc::signal(sig, handler) } == libc::SIG_ERR {
            crate::warn!("cannot install a handler for signal {sig}");
        }
    }
}

pub(crate) fn signalled() -> bool {
    SIGNALLED.load(Ordering::SeqCst)
}

/// A stop request plus a wake-up for threads sleeping between attempts.
#[derive(Default)]
pub(crate) struct Stop {
    /// (stop requested, wake-ups so far)
    state: Mutex<(bool, u64)>,
    cv: Condvar,
}

impl Stop {
    pub(crate) fn request(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.0 = true;
        s.1 += 1;
        self.cv.notify_all();
    }

    /// Wake sleepers without asking them to stop (they re-check what they wait for).
    pub(crate) fn wake(&self) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.1 += 1;
        self.cv.notify_all();
    }

    pub(crate) fn requested(&self) -> bool {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Sleep up to `d`, less if a stop is requested or someone wakes us (callers then check
    /// `requested()` and what else they wait for).
    pub(crate) fn sleep(&self, d: Duration) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let seen = s.1;
        let _ = self
            .cv
            .wait_timeout_while(s, d, |s| !s.0 && s.1 == seen)
            .unwrap_or_else(|e| e.into_inner());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn sleepers_wake_on_stop_and_on_wake() {
        let stop = Stop::default();
        let t = Instant::now();
        std::thread::scope(|s| {
            let h = s.spawn(|| stop.sleep(Duration::from_secs(60)));
            std::thread::sleep(Duration::from_millis(50));
            stop.wake();
            h.join().unwrap();
            assert!(!stop.requested());
            let h = s.spawn(|| stop.sleep(Duration::from_secs(60)));
            std::thread::sleep(Duration::from_millis(50));
            stop.request();
            h.join().unwrap();
            assert!(stop.requested());
        });
        // Once stopping, a sleep returns at once.
        stop.sleep(Duration::from_secs(60));
        assert!(t.elapsed() < Duration::from_secs(30));
    }
}
