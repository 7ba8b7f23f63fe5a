//! The `hookbox` command: see `hookbox --help`.

/// mimalloc instead of the system's malloc: see Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    hookbox::cli::main()
}
