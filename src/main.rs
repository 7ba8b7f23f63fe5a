//! The `hookbox` command: see `hookbox --help`.

fn main() -> std::process::ExitCode {
    hookbox::cli::main()
}
