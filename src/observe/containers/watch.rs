//! The engines, asked on a thread of their own: a container's name is looked up once per
//! container id and cached, and each engine is pinged every refresh interval, so a scrape
//! only reads the cache and a missing or hung engine delays nothing but the lookups
//! queued behind it. A one-shot command waits for its lookups, within a budget.

use super::config::ContainersConfig;
use super::engine::{self, is_id};
use super::reading::{ContainerName, ContainersReading, Engine, EngineError, EngineHealth};
use crate::dates::now_unix_seconds_f64;
use crate::observe::error_line::one_line;
use crate::observe::lifespan::Lifespan;
use crate::sync::lock;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Most container ids remembered; a host runs at most a few hundred containers at once.
const MAX_REMEMBERED: usize = 4096;

/// A container to name, and the engines that may know it, in the order to ask them.
pub(crate) type Wanted = (String, Vec<Engine>);

/// What is known of one container id.
#[derive(Debug, Clone)]
enum Entry {
    /// Named by an engine: kept, since an id never changes its container.
    Named(ContainerName),
    /// Asked for; the answer has not come yet.
    Asked,
    /// No engine asked named it (none knew it, or none answered): asked again after `retry`.
    Unnamed { retry: Instant },
}

/// What the thread and the observations share.
#[derive(Debug)]
struct Shared {
    engines: BTreeMap<Engine, EngineHealth>,
    /// The engines whose series are served: those expected (their socket given on the
    /// command line) and those whose socket was found since start. A host without Docker
    /// gets no `vram_container_engine_*` series for it, rather than an `_up 0`.
    shown: BTreeSet<Engine>,
    cache: HashMap<String, Entry>,
}

/// Containers to name; `answered` hears once they are.
struct Request {
    wanted: Vec<Wanted>,
    answered: Option<mpsc::Sender<()>>,
}

/// The container engines, asked on a thread of their own.
#[derive(Debug)]
pub(crate) struct ContainerWatch {
    shared: Arc<Mutex<Shared>>,
    requests: Mutex<mpsc::Sender<Request>>,
    /// How long a one-shot command waits for names; `None` for a server, which never does.
    wait: Option<Duration>,
}

impl ContainerWatch {
    /// Watches the engines whose socket paths are set: checks each at once, on the thread,
    /// and, for a server, again every refresh interval. A server does not wait for the
    /// first check (until it answers an engine is down, "not checked yet"); a one-shot
    /// command, whose output says how each engine is, waits for it within the timeout.
    pub(crate) fn start(config: ContainersConfig, lifespan: Lifespan) -> ContainerWatch {
        let sockets: Vec<(Engine, PathBuf)> = [
            (Engine::Docker, config.docker_socket.clone()),
            (Engine::Podman, config.podman_socket.clone()),
        ]
        .into_iter()
        .filter(|(_, socket)| !socket.as_os_str().is_empty())
        .collect();
        let shared = Arc::new(Mutex::new(Shared {
            engines: sockets
                .iter()
                .map(|(engine, _)| {
                    let health = EngineHealth {
                        error: Some(EngineError::Unavailable),
                        message: Some("not checked yet".into()),
                        last_success_unix_seconds: None,
                    };
                    (*engine, health)
                })
                .collect(),
            // An engine whose socket is there is shown from the start, before its first
            // check answers (a server does not wait for it).
            shown: sockets
                .iter()
                .filter(|(engine, socket)| config.expected.contains(engine) || socket.exists())
                .map(|(engine, _)| *engine)
                .collect(),
            cache: HashMap::new(),
        }));
        let (requests, received) = mpsc::channel();
        let (first_done, first) = mpsc::channel();
        let engines = sockets.len() as u32;
        let thread = Thread {
            expected: config.expected,
            sockets,
            timeout: config.timeout,
            refresh_interval: config.refresh_interval,
            shared: Arc::clone(&shared),
            lifespan,
        };
        let spawned = std::thread::Builder::new()
            .name("container-engines".into())
            .spawn(move || thread.run(&received, first_done));
        match spawned {
            Ok(_) if lifespan == Lifespan::OneShot => {
                let _ = first.recv_timeout(config.timeout * engines + Duration::from_millis(100));
            }
            Ok(_) => {}
            Err(error) => {
                tracing::error!(error = %error, "cannot start the container engines' thread; containers are not named")
            }
        }
        ContainerWatch {
            shared,
            requests: Mutex::new(requests),
            // Behind a check of each engine, then one lookup per engine.
            wait: (lifespan == Lifespan::OneShot).then(|| config.timeout * 5),
        }
    }

    /// The engines' health and the names of the `wanted` containers known now; a
    /// one-shot command first waits (within its budget, and never past `until`, the
    /// look's deadline) for those never asked for.
    pub(crate) fn reading(&self, wanted: Vec<Wanted>, until: Instant) -> ContainersReading {
        let mut reading = ContainersReading::default();
        self.add_names(&mut reading, wanted, until);
        reading
    }

    /// Adds the names of the `wanted` containers to `reading`, and the engines' health
    /// as it is now; a one-shot command waits for new ones until `until` at the latest.
    pub(crate) fn add_names(
        &self,
        reading: &mut ContainersReading,
        wanted: Vec<Wanted>,
        until: Instant,
    ) {
        let wanted: Vec<Wanted> = wanted
            .into_iter()
            .filter(|(id, engines)| is_id(id) && !engines.is_empty())
            .collect();
        let to_ask: Vec<Wanted> = {
            let mut shared = lock(&self.shared);
            let now = Instant::now();
            if shared.cache.len() >= MAX_REMEMBERED {
                shared
                    .cache
                    .retain(|_, entry| matches!(entry, Entry::Named(_)));
                if shared.cache.len() >= MAX_REMEMBERED {
                    shared.cache.clear();
                }
            }
            let mut to_ask = Vec::new();
            for (id, engines) in &wanted {
                let ask = match shared.cache.get(id) {
                    None => true,
                    Some(Entry::Unnamed { retry }) => *retry <= now,
                    Some(Entry::Named(_) | Entry::Asked) => false,
                };
                if ask && !to_ask.iter().any(|(asked, _): &Wanted| asked == id) {
                    shared.cache.insert(id.clone(), Entry::Asked);
                    to_ask.push((id.clone(), engines.clone()));
                }
            }
            to_ask
        };
        if !to_ask.is_empty() {
            let (answered, heard) = mpsc::channel();
            let request = Request {
                wanted: to_ask,
                answered: self.wait.map(|_| answered),
            };
            if lock(&self.requests).send(request).is_ok() {
                if let Some(wait) = self.wait {
                    let left = until.saturating_duration_since(Instant::now());
                    let _ = heard.recv_timeout(wait.min(left));
                }
            }
        }
        let shared = lock(&self.shared);
        reading.engines = shared
            .engines
            .iter()
            .filter(|(engine, _)| shared.shown.contains(engine))
            .map(|(engine, health)| (*engine, health.clone()))
            .collect();
        for (id, _) in wanted {
            if let Some(Entry::Named(name)) = shared.cache.get(&id) {
                reading.names.insert(id, name.clone());
            }
        }
    }
}

/// The thread's side.
struct Thread {
    /// The engines whose sockets were given on the command line.
    expected: BTreeSet<Engine>,
    sockets: Vec<(Engine, PathBuf)>,
    timeout: Duration,
    refresh_interval: Duration,
    shared: Arc<Mutex<Shared>>,
    lifespan: Lifespan,
}

impl Thread {
    fn run(self, requests: &mpsc::Receiver<Request>, first_done: mpsc::Sender<()>) {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(error) => {
                tracing::error!(error = %error, "cannot start the container engines' client; containers are not named");
                return;
            }
        };
        self.ping(&runtime, true);
        let _ = first_done.send(());
        let mut next_ping = Instant::now() + self.refresh_interval;
        let mut said_missing = false;
        loop {
            let now = Instant::now();
            if now >= next_ping {
                // A one-shot command checked once; its lookups say the rest.
                if self.lifespan == Lifespan::Serving {
                    self.ping(&runtime, false);
                    if !said_missing {
                        self.say_missing();
                        said_missing = true;
                    }
                }
                next_ping = Instant::now() + self.refresh_interval;
                continue;
            }
            match requests.recv_timeout(next_ping - now) {
                Ok(request) => self.answer(&runtime, request),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Checks that every engine answers.
    fn ping(&self, runtime: &tokio::runtime::Runtime, first: bool) {
        for (engine, socket) in &self.sockets {
            let result = runtime.block_on(engine::ping(socket, self.timeout));
            self.record(*engine, result.as_ref().err(), first);
        }
    }

    /// After a server's second check, the engines neither there nor expected get one line
    /// together, and no series: at the second check rather than the first, so that a
    /// start-up error (a port in use) stays the only line of a server that does not start.
    fn say_missing(&self) {
        let shown = lock(&self.shared).shown.clone();
        let missing: Vec<String> = self
            .sockets
            .iter()
            .filter(|(engine, _)| !shown.contains(engine))
            .map(|(engine, socket)| format!("{} ({})", engine.as_str(), socket.display()))
            .collect();
        if !missing.is_empty() {
            tracing::info!(
                engines = missing.join(", "),
                "no socket for these container engines; their containers are named by id only, and an engine's series appear once its socket is found"
            );
        }
    }

    /// Names each container of `request`, asking its engines in order until one knows it.
    fn answer(&self, runtime: &tokio::runtime::Runtime, request: Request) {
        for (id, engines) in request.wanted {
            let mut named = None;
            for engine in engines {
                let Some((_, socket)) = self.sockets.iter().find(|(known, _)| *known == engine)
                else {
                    continue;
                };
                let result = runtime.block_on(engine::name_of(engine, socket, &id, self.timeout));
                self.record(engine, result.as_ref().err(), false);
                if let Ok(Some(name)) = result {
                    named = Some(name);
                    break;
                }
            }
            let entry = match named {
                Some(name) => Entry::Named(name),
                None => Entry::Unnamed {
                    retry: Instant::now() + self.refresh_interval,
                },
            };
            lock(&self.shared).cache.insert(id, entry);
        }
        if let Some(answered) = request.answered {
            let _ = answered.send(());
        }
    }

    /// Keeps how an engine's call went, and logs a change of state (a server only).
    fn record(&self, engine: Engine, error: Option<&engine::CallError>, first: bool) {
        let mut shared = lock(&self.shared);
        let Some(health) = shared.engines.get_mut(&engine) else {
            return;
        };
        let before = health.error;
        match error {
            None => {
                health.error = None;
                health.message = None;
                health.last_success_unix_seconds = Some(now_unix_seconds_f64());
            }
            Some(error) => {
                health.error = Some(error.kind());
                health.message = Some(one_line(error));
            }
        }
        let (now, message) = (health.error, health.message.clone());
        if now != Some(EngineError::Absent) {
            shared.shown.insert(engine);
        }
        drop(shared);
        if self.lifespan == Lifespan::OneShot || (!first && before == now) {
            return;
        }
        let expected = self.expected.contains(&engine);
        let engine = engine.as_str();
        match now {
            None if first => tracing::debug!(engine, "container engine answers"),
            None => tracing::info!(engine, "container engine answers"),
            Some(EngineError::Absent) if first && !expected => tracing::debug!(
                engine,
                "container engine absent (no socket at its path); its containers are named by id only"
            ),
            Some(EngineError::Absent) => tracing::info!(
                engine,
                "container engine absent (no socket at its path); its containers are named by id only"
            ),
            Some(_) => tracing::warn!(
                engine,
                error = message.as_deref().unwrap_or_default(),
                "container engine failing; containers it has not named yet are named by id only (logged again when it changes)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;

    const ID: &str = "a7bf71c4eb3968e1ee96f65a135da712aebd7f7a68d3fcd9622cec36048bbf31";

    /// A stand-in Docker engine on a socket of its own: it answers `/_ping` and inspects
    /// of `ID`, counting the inspects; 404 for anything else.
    fn stand_in_docker(dir: &std::path::Path) -> (PathBuf, Arc<Mutex<u32>>) {
        let socket = dir.join("docker.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let inspects = Arc::new(Mutex::new(0));
        let counted = Arc::clone(&inspects);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let request = request_head(&mut stream);
                let request = String::from_utf8_lossy(&request);
                let (status, body) = if request.starts_with("GET /_ping ") {
                    ("200 OK", "OK".to_string())
                } else if request.starts_with(&format!("GET /containers/{ID}/json ")) {
                    *lock(&counted) += 1;
                    (
                        "200 OK",
                        r#"{"Name":"/trainer","Config":{"Image":"model:1","Labels":{}}}"#
                            .to_string(),
                    )
                } else {
                    (
                        "404 Not Found",
                        r#"{"message":"no such container"}"#.to_string(),
                    )
                };
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (socket, inspects)
    }

    /// A request's head, read up to its blank line (or what came before the client
    /// stopped sending).
    fn request_head(stream: &mut impl Read) -> Vec<u8> {
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
            request.push(byte[0]);
        }
        request
    }

    /// A deadline no test reaches.
    fn later() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    /// Accepts connections on `socket` and never answers, until the test ends.
    fn hung_engine(socket: &std::path::Path) -> std::thread::JoinHandle<()> {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let mut open = Vec::new();
            for stream in listener.incoming().take(8) {
                open.push(stream);
            }
            std::thread::sleep(Duration::from_secs(5));
        })
    }

    /// An engine that answers `/_ping` and never answers a lookup.
    fn engine_hung_in_lookups(socket: &std::path::Path) {
        let listener = UnixListener::bind(socket).unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let request = request_head(&mut stream);
                if request.starts_with(b"GET /_ping ") {
                    let _ = write!(
                        stream,
                        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nOK"
                    );
                } else {
                    held.push(stream);
                }
            }
        });
    }

    fn config(docker: PathBuf, podman: PathBuf) -> ContainersConfig {
        ContainersConfig {
            docker_socket: docker,
            podman_socket: podman,
            timeout: Duration::from_millis(500),
            refresh_interval: Duration::from_secs(60),
            expected: BTreeSet::new(),
        }
    }

    #[test]
    fn a_container_is_named_once_and_served_from_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (docker, inspects) = stand_in_docker(dir.path());
        let watch = ContainerWatch::start(
            config(docker, dir.path().join("no-podman.sock")),
            Lifespan::OneShot,
        );
        let wanted = || vec![(ID.to_string(), vec![Engine::Docker, Engine::Podman])];
        let reading = watch.reading(wanted(), later());
        assert_eq!(reading.names[ID].name, "trainer");
        assert_eq!(reading.names[ID].image.as_deref(), Some("model:1"));
        assert!(reading.engines[&Engine::Docker].up());
        assert!(reading.engines[&Engine::Docker]
            .last_success_unix_seconds
            .is_some());
        // Podman's socket is not there, and was not given: no health, so no series.
        assert!(
            !reading.engines.contains_key(&Engine::Podman),
            "{reading:?}"
        );
        let again = watch.reading(wanted(), later());
        assert_eq!(again.names, reading.names);
        assert_eq!(
            *lock(&inspects),
            1,
            "the second reading asked the engine again"
        );
    }

    #[test]
    fn an_engine_is_shown_once_its_socket_is_found_or_when_it_was_given() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(
            dir.path().join("docker.sock"),
            dir.path().join("podman.sock"),
        );
        config.expected = BTreeSet::from([Engine::Podman]);
        config.refresh_interval = Duration::from_millis(50);
        let watch = ContainerWatch::start(config, Lifespan::Serving);
        // Podman was given: absent, and said so. Docker was not: no word of it.
        let mut reading = watch.reading(Vec::new(), later());
        let started = Instant::now();
        while reading
            .engines
            .get(&Engine::Podman)
            .and_then(|health| health.error)
            != Some(EngineError::Absent)
        {
            assert!(started.elapsed() < Duration::from_secs(5), "{reading:?}");
            std::thread::sleep(Duration::from_millis(20));
            reading = watch.reading(Vec::new(), later());
        }
        assert!(
            !reading.engines.contains_key(&Engine::Docker),
            "{reading:?}"
        );
        // Docker starts: found at the next check, and shown from then on.
        let (_docker, _) = stand_in_docker(dir.path());
        while !reading
            .engines
            .get(&Engine::Docker)
            .is_some_and(|health| health.up())
        {
            assert!(started.elapsed() < Duration::from_secs(5), "{reading:?}");
            std::thread::sleep(Duration::from_millis(20));
            reading = watch.reading(Vec::new(), later());
        }
    }

    #[test]
    fn an_engine_that_never_answers_is_down_and_holds_up_no_server() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("hung.sock");
        let held = hung_engine(&socket);
        let started = Instant::now();
        let watch = ContainerWatch::start(config(socket, PathBuf::new()), Lifespan::Serving);
        let wanted = || vec![(ID.to_string(), vec![Engine::Docker])];
        let mut reading = watch.reading(wanted(), later());
        assert!(
            started.elapsed() < Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        assert!(!reading.engines[&Engine::Docker].up());
        // The ping, then the lookup, each give up at the timeout: the engine is down.
        while reading.engines[&Engine::Docker].error != Some(EngineError::Timeout) {
            assert!(started.elapsed() < Duration::from_secs(5), "{reading:?}");
            std::thread::sleep(Duration::from_millis(20));
            reading = watch.reading(wanted(), later());
        }
        assert!(reading.names.is_empty());
        // An empty path leaves the engine out.
        assert!(!reading.engines.contains_key(&Engine::Podman));
        drop(held);
    }

    #[test]
    fn a_one_shot_look_waits_for_a_hung_engine_no_longer_than_its_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("slow.sock");
        engine_hung_in_lookups(&socket);
        // A one-shot watch waits for new names as long as the engine's call may take (3 s
        // here, up to five such calls), but never past the look's own deadline.
        let config = ContainersConfig {
            timeout: Duration::from_secs(3),
            ..config(socket, PathBuf::new())
        };
        let watch = ContainerWatch::start(config, Lifespan::OneShot);
        assert!(watch.reading(Vec::new(), later()).engines[&Engine::Docker].up());
        let started = Instant::now();
        let reading = watch.reading(
            vec![(ID.to_string(), vec![Engine::Docker])],
            started + Duration::from_millis(150),
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "waited {:?}",
            started.elapsed()
        );
        assert!(reading.names.is_empty());
    }
}
