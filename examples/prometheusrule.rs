//! Writes `deploy/kubernetes/prometheusrule.yaml` from `alerts/vram-exporter.rules.yml`,
//! the one source of the alert rules: `cargo run --example prometheusrule` after changing
//! the rules. The integration test `deploy::prometheusrule_is_generated_from_the_rules`
//! fails until the two agree.

#[path = "../tests/integration/prometheusrule.rs"]
mod prometheusrule;

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR"));
    let source = repository.join("alerts/vram-exporter.rules.yml");
    let target = repository.join("deploy/kubernetes/prometheusrule.yaml");
    let rules = match std::fs::read_to_string(&source)
        .map_err(|error| error.to_string())
        .and_then(|text| serde_norway::from_str(&text).map_err(|error| error.to_string()))
    {
        Ok(rules) => rules,
        Err(error) => {
            eprintln!("prometheusrule: cannot read {}: {error}", source.display());
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = std::fs::write(&target, prometheusrule::prometheus_rule(&rules)) {
        eprintln!("prometheusrule: cannot write {}: {error}", target.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", target.display());
    ExitCode::SUCCESS
}
