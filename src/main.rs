use std::process::ExitCode;

fn main() -> ExitCode {
    vram_exporter::run()
}
