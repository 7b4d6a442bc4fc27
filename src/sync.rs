//! Locks that survive a panic elsewhere.

use std::sync::{Mutex, MutexGuard};

/// Lock `mutex` even when a thread panicked while holding it.
///
/// Every mutex of the exporter guards state that stays consistent between statements
/// (a cache, a set of open connections, a token bucket), so a panic in one request or
/// collection must not turn every later scrape into a second panic.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_mutex_still_locks_with_its_value() {
        let mutex = std::sync::Arc::new(Mutex::new(41));
        let poisoner = std::sync::Arc::clone(&mutex);
        let panicked = std::thread::spawn(move || {
            let mut value = poisoner.lock().unwrap();
            *value += 1;
            panic!("poison the mutex");
        })
        .join();
        assert!(panicked.is_err());
        assert!(mutex.is_poisoned());
        assert_eq!(*lock(&mutex), 42);
    }
}
