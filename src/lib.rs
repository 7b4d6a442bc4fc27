//! vram-exporter: which GPU memory is owned by a live process and which is orphaned.
//!
//! Data flows one way: [`observe`] (NVML and `/proc`, the only code that touches the
//! system) -> [`classify`] (pure functions to a verdict) -> [`render`] (Prometheus text,
//! a table for people, JSON).

#![warn(missing_docs)]

pub mod classify;
pub(crate) mod cli;
pub(crate) mod commands;
pub(crate) mod dates;
pub(crate) mod exit_codes;
pub mod exporter;
pub(crate) mod logging;
pub mod observe;
pub mod render;
pub(crate) mod sync;
pub(crate) mod units;
pub(crate) mod web;

use cli::{Cli, CliError, Config, Mode};
use exporter::Exporter;
use observe::procfs::ProcRoot;
use observe::{Lifespan, LiveHost, PidNamespace, ProcfsView, Source, StateConfig};
use render::prometheus::RenderOptions;
use std::process::ExitCode;
use std::sync::Arc;
use web::ServeConfig;

/// Parse flags, run the chosen mode, and turn any error into one line and an exit status.
pub fn run() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let config = match config_from_command_line(&args) {
        Ok(config) => config,
        Err(CliError::Info(help_or_version)) => {
            let _ = help_or_version.print();
            return ExitCode::SUCCESS;
        }
        // A plugin's caller reads a mistake as unknown, whether or not the rest parsed.
        Err(mistake) => return fail(mistake.into(), exit_codes::asked_in(&args).error()),
    };
    logging::init(config.log_level, config.log_format);
    let error = match &config.mode {
        Mode::Check(check) => check.exit_codes.error(),
        _ => exit_codes::ERROR,
    };
    run_mode(config).unwrap_or_else(|failure| fail(failure, error))
}

fn config_from_command_line(args: &[std::ffi::OsString]) -> Result<Config, CliError> {
    Ok(Cli::from_command_line(args.iter().cloned())?.into_config()?)
}

/// Say `error` in one line, each cause once, and end with `status`.
fn fail(error: anyhow::Error, status: u8) -> ExitCode {
    eprintln!("vram-exporter: {error:#}");
    ExitCode::from(status)
}

/// Run the mode `config` chose: the one place that tells the modes apart.
fn run_mode(config: Config) -> anyhow::Result<ExitCode> {
    let one_shot = || exporter(&config, Lifespan::OneShot);
    match &config.mode {
        Mode::Serve(serve) => serve_metrics(serve.clone(), &config),
        Mode::Check(check) => commands::check::run(&one_shot()?, check),
        Mode::Snapshot { output, timeout } => {
            commands::snapshot::run(&one_shot()?, output.as_deref(), *timeout)
        }
        Mode::CopyTo { folder } => commands::copy_to::run(folder),
        Mode::Textfile { output, timeout } => {
            commands::textfile::run(&Arc::new(one_shot()?), output, *timeout)
        }
    }
}

/// Serve metrics until stopped.
fn serve_metrics(serve: ServeConfig, config: &Config) -> anyhow::Result<ExitCode> {
    // A mistake in the web config file (or a certificate it names) is a start-up error,
    // reported before anything else and before the port is taken.
    let web = match &serve.web_config_file {
        Some(path) => web::WebConfig::load(path)?,
        None => web::WebConfig::none(),
    };
    let exporter = Arc::new(exporter(config, Lifespan::Serving)?.with_own_process());
    warn_if_blind(&exporter, config);
    // A missing NVML is logged now, not at the first scrape; the server does not wait
    // for it (a hung init is the first scrape's to report).
    exporter.start_loading_nvml();
    web::run(serve, exporter, web)?;
    Ok(ExitCode::SUCCESS)
}

/// The exporter every mode looks through.
fn exporter(config: &Config, lifespan: Lifespan) -> anyhow::Result<Exporter> {
    if let Some(path) = &config.replay {
        // A snapshot that cannot be read is a mistake to report now, not a scrape later.
        observe::read_snapshot(path)?;
    }
    Ok(Exporter::new(
        source(config, lifespan)?
            .with_kubernetes(&config.kubernetes, lifespan)
            .with_containers(&config.containers, lifespan),
        config.settings.clone(),
        RenderOptions {
            per_process_limit: config.per_process_limit,
        },
    ))
}

fn source(config: &Config, lifespan: Lifespan) -> anyhow::Result<Source> {
    let Some(path) = &config.replay else {
        let proc_root = ProcRoot {
            root: config.procfs.clone(),
            device_prefix: config.device_prefix.clone(),
            stand_in: config.procfs_stand_in,
        };
        // A procfs that shows no process would make every owner look exited.
        proc_root.check_is_procfs()?;
        return Ok(Source::Live(Box::new(
            LiveHost::new(
                config.nvml_library.clone(),
                proc_root,
                config.scan_timeout,
                lifespan,
                StateConfig {
                    directory: config.state.clone(),
                    // What a server and the textfile timer see, they keep; `check` and
                    // `snapshot` only read it.
                    keep: matches!(config.mode, Mode::Serve(_) | Mode::Textfile { .. }),
                },
            )
            .with_mig_minors(config.mig_minors.clone())
            .with_one_gpu_at_a_time(config.nvml_one_gpu_at_a_time),
        )));
    };
    Ok(Source::Replay(path.clone()))
}

/// Outside the host PID namespace NVML hides other processes, and a procfs of another
/// namespace shows none of NVML's owners; say so once, loudly.
fn warn_if_blind(exporter: &Exporter, config: &Config) {
    if exporter.procfs_view() == Some(ProcfsView::Unknown) {
        tracing::warn!(
            procfs = %config.procfs.display(),
            "the procfs read shows another PID namespace, in which this process is not: the owners NVML names cannot be looked up, so none is judged and no memory is called orphaned (vram_procfs_own_pid_namespace 0); point --path.procfs at the host's /proc"
        );
    }
    match exporter.host_pid_namespace() {
        // A replay has nothing live to look at.
        None | Some(PidNamespace::Host) => {}
        Some(PidNamespace::Other) => tracing::warn!(
            "not in the host PID namespace: NVML hides processes of other namespaces, so memory without a visible owner is reported as unattributed, never as orphaned (vram_host_pid_namespace 0); run with the host's PID namespace (hostPID: true, --pid=host)"
        ),
        Some(PidNamespace::Unreadable) => tracing::warn!(
            procfs = %config.procfs.display(),
            "cannot read the PID namespace of this process; treating the exporter as blind"
        ),
    }
}
