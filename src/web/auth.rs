//! `basic_auth_users`: HTTP basic authentication against bcrypt hashes.
//!
//! bcrypt compares in constant time over the hash; a user that does not exist is checked
//! against a configured user's hash all the same (and then refused), so the time of a
//! refusal does not tell whether the user exists. bcrypt is slow on purpose (about 70 ms
//! at cost 10), so a successful check is remembered under a SHA-256 of the user, the hash
//! and the password, and a scraper that sends the same credentials every 15 s pays it once.
//! Checks run one at a time on the blocking pool, never on the async threads.

use super::error::{invalid, ConfigError};
use crate::sync::lock;
use base64::Engine;
use hyper::header::HeaderValue;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// bcrypt's cost bounds, as Go's `bcrypt.Cost` checks them.
const MIN_COST: u32 = 4;
const MAX_COST: u32 = 31;
/// Remembered successful checks; the set is emptied when it fills up.
const CACHE_CAPACITY: usize = 1024;

/// Validated users: name -> bcrypt hash.
#[derive(Debug, Clone)]
pub struct Users {
    hashes: BTreeMap<String, String>,
    /// Checked when the user does not exist, so that a refusal takes as long either way.
    decoy: String,
}

impl Users {
    /// Check every hash now: a hash that bcrypt cannot read would refuse its user forever.
    pub(crate) fn new(users: &BTreeMap<String, String>) -> Result<Users, ConfigError> {
        for (user, hash) in users {
            if user.contains(':') {
                return Err(invalid!(
                    "user {user:?}: a user name cannot contain ':' in basic authentication"
                ));
            }
            let parts: bcrypt::HashParts = hash.parse().map_err(|error| {
                invalid!("user {user:?}: not a bcrypt hash ({error}); make one with: htpasswd -nBC 10 \"\" | tr -d ':\\n'")
            })?;
            let cost = parts.get_cost();
            if !(MIN_COST..=MAX_COST).contains(&cost) {
                return Err(invalid!(
                    "user {user:?}: bcrypt cost {cost} is outside {MIN_COST}..={MAX_COST}"
                ));
            }
        }
        // The most expensive configured hash, so that an unknown user costs no less.
        let decoy = users
            .values()
            .max_by_key(|hash| {
                hash.parse::<bcrypt::HashParts>()
                    .map(|parts| parts.get_cost())
                    .unwrap_or(0)
            })
            .cloned()
            .ok_or_else(|| invalid!("no users"))?;
        Ok(Users {
            hashes: users.clone(),
            decoy,
        })
    }

    /// How many users there are.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }
}

/// Checks credentials, remembering successes across requests and config reloads.
#[derive(Debug)]
pub struct Authenticator {
    verified: Mutex<HashSet<[u8; 32]>>,
    /// One bcrypt at a time: a flood of wrong passwords costs one core, not all of them.
    bcrypt: Arc<Semaphore>,
}

impl Default for Authenticator {
    fn default() -> Self {
        Authenticator {
            verified: Mutex::new(HashSet::new()),
            bcrypt: Arc::new(Semaphore::new(1)),
        }
    }
}

impl Authenticator {
    /// Whether `authorization` (the request's header) names a user of `users` with the
    /// right password.
    pub async fn check(&self, users: &Users, authorization: Option<&HeaderValue>) -> bool {
        let Some((user, password)) = authorization.and_then(basic_credentials) else {
            return false;
        };
        let (hash, known) = match users.hashes.get(&user) {
            Some(hash) => (hash.clone(), true),
            None => (users.decoy.clone(), false),
        };
        let key = cache_key(&user, &hash, &password);
        if known && lock(&self.verified).contains(&key) {
            return true;
        }
        let Ok(_permit) = Arc::clone(&self.bcrypt).acquire_owned().await else {
            return false;
        };
        let matched = tokio::task::spawn_blocking(move || {
            bcrypt::verify(password.as_bytes(), &hash).unwrap_or(false)
        })
        .await
        .unwrap_or(false);
        let accepted = known && matched;
        if accepted {
            let mut verified = lock(&self.verified);
            if verified.len() >= CACHE_CAPACITY {
                verified.clear();
            }
            verified.insert(key);
        }
        accepted
    }
}

/// `Basic base64(user:password)`; `None` for anything else.
fn basic_credentials(value: &HeaderValue) -> Option<(String, String)> {
    let value = value.to_str().ok()?;
    let (scheme, encoded) = value.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// Length-prefixed, so that no two (user, hash, password) triples share a key.
fn cache_key(user: &str, hash: &str, password: &str) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user, hash, password] {
        context.update(&(part.len() as u64).to_be_bytes());
        context.update(part.as_bytes());
    }
    let digest = context.finish();
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn users(password: &str) -> Users {
        let hash = bcrypt::hash(password, 4).unwrap();
        Users::new(&BTreeMap::from([("alice".to_string(), hash)])).unwrap()
    }

    fn header(user: &str, password: &str) -> HeaderValue {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        HeaderValue::from_str(&format!("Basic {encoded}")).unwrap()
    }

    #[tokio::test]
    async fn right_password_only() {
        let users = users("secret");
        let auth = Authenticator::default();
        assert!(auth.check(&users, Some(&header("alice", "secret"))).await);
        // Remembered, and still right.
        assert!(auth.check(&users, Some(&header("alice", "secret"))).await);
        assert!(!auth.check(&users, Some(&header("alice", "wrong"))).await);
        assert!(!auth.check(&users, Some(&header("bob", "secret"))).await);
        assert!(!auth.check(&users, None).await);
        let bearer = HeaderValue::from_static("Bearer abc");
        assert!(!auth.check(&users, Some(&bearer)).await);
        let garbage = HeaderValue::from_static("Basic !!!");
        assert!(!auth.check(&users, Some(&garbage)).await);
    }

    #[test]
    fn bad_hashes_are_refused() {
        for hash in [
            "plain",
            "$2y$10$short",
            "$2y$99$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi",
        ] {
            let result = Users::new(&BTreeMap::from([("alice".to_string(), hash.to_string())]));
            assert!(result.is_err(), "{hash}");
        }
        let good = "$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi";
        assert!(Users::new(&BTreeMap::from([("alice".to_string(), good.to_string())])).is_ok());
    }

    #[test]
    fn cache_keys_do_not_collide_across_boundaries() {
        // Every way of cutting one string into user, hash and password (both cuts moved
        // over every position, empty parts included) gives a key of its own; the same
        // three parts always give the same key.
        for whole in ["alice$2y$10$hashsecret", "aaaa", "a:b", ""] {
            let cuts: Vec<(usize, usize)> = (0..=whole.len())
                .flat_map(|first| (first..=whole.len()).map(move |second| (first, second)))
                .collect();
            let mut keys = HashSet::new();
            for &(first, second) in &cuts {
                let (user, hash, password) =
                    (&whole[..first], &whole[first..second], &whole[second..]);
                let key = cache_key(user, hash, password);
                assert_eq!(key, cache_key(user, hash, password));
                assert!(
                    keys.insert(key),
                    "{user:?} {hash:?} {password:?} shares a key with another cut of {whole:?}"
                );
            }
            assert_eq!(keys.len(), (whole.len() + 1) * (whole.len() + 2) / 2);
        }
    }
}
