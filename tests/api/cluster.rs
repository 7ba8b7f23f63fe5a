//! A private PostgreSQL cluster for one test, on a free port in a temporary directory, so the
//! test can shut it down and start it again without touching the shared server.
//!
//! `initdb` refuses to run as root, so when the tests run as root the cluster belongs to the
//! `postgres` OS user and its commands go through `runuser`.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use diesel::prelude::*;

use crate::helpers::child_port;

pub struct Cluster {
    dir: PathBuf,
    bin: PathBuf,
    pub port: u16,
    /// Run the server's commands as this OS user (when the tests run as root).
    user: Option<String>,
}

/// Where `initdb` and `pg_ctl` are: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin`.
fn bin_dir() -> Option<PathBuf> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    let mut candidates: Vec<PathBuf> = from_pg_config.into_iter().collect();
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("bin"))
        .collect();
    versions.sort();
    candidates.extend(versions.into_iter().rev());
    candidates
        .into_iter()
        .find(|dir| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file())
}

fn id_of(user: &str, flag: &str) -> Option<u32> {
    let out = Command::new("id").args([flag, user]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

impl Cluster {
    /// initdb + start. `Err` says why a private cluster cannot be had on this machine (the
    /// caller skips its test, saying so).
    pub fn start() -> Result<Cluster, String> {
        let bin = bin_dir()
            .ok_or("no initdb/pg_ctl found (pg_config --bindir, /usr/lib/postgresql/*/bin)")?;
        let as_root = std::fs::metadata("/proc/self")
            .map(|m| m.uid() == 0)
            .unwrap_or(false);
        let user = if as_root {
            if !Path::new("/usr/sbin/runuser").exists() && !Path::new("/sbin/runuser").exists() {
                return Err(
                    "running as root, and initdb refuses root, but runuser is missing".into(),
                );
            }
            Some("postgres".to_owned())
        } else {
            None
        };
        let port = child_port();
        let dir = std::env::temp_dir().join(format!("hookbox-pg-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if let Some(user) = &user {
            let (uid, gid) = id_of(user, "-u")
                .zip(id_of(user, "-g"))
                .ok_or("running as root, and there is no postgres OS user to run initdb as")?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot hand {} to postgres: {e}", dir.display()))?;
        }
        let cluster = Cluster {
            dir,
            bin,
            port,
            user,
        };
        let data = cluster.data();
        let out = cluster.run(
            "initdb",
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "-E",
                "UTF8",
            ],
        )?;
        if !out.status.success() {
            return Err(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        cluster.start_server()?;
        Ok(cluster)
    }

    fn data(&self) -> String {
        self.dir.join("data").to_string_lossy().into_owned()
    }

    fn run(&self, tool: &str, args: &[&str]) -> Result<Output, String> {
        let program = self.bin.join(tool);
        let mut command = match &self.user {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(&program);
                command
            }
            None => Command::new(&program),
        };
        command
            .args(args)
            .current_dir(&self.dir)
            .output()
            .map_err(|e| format!("cannot run {tool}: {e}"))
    }

    fn start_server(&self) -> Result<(), String> {
        let options = format!(
            "-k {} -p {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40 -c shared_buffers=16MB",
            self.dir.display(),
            self.port
        );
        let log = self.dir.join("server.log").to_string_lossy().into_owned();
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-w",
                "-o",
                &options,
                "start",
            ],
        )?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start failed: {}{}",
                String::from_utf8_lossy(&out.stderr),
                std::fs::read_to_string(&log).unwrap_or_default()
            ))
        }
    }

    /// `postgres://postgres@127.0.0.1:PORT/{database}`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    pub fn create_database(&self, name: &str) {
        let mut conn =
            PgConnection::establish(&self.url("postgres")).expect("connect to the private cluster");
        diesel::sql_query(format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .expect("create the database");
    }

    /// `pg_ctl stop -m fast`: open transactions are rolled back and sessions ended.
    pub fn stop_fast(&self) {
        let out = self
            .run("pg_ctl", &["-D", &self.data(), "-m", "fast", "-w", "stop"])
            .expect("pg_ctl stop");
        assert!(
            out.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn start_again(&self) {
        self.start_server().expect("pg_ctl start");
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Says, past the test harness's capture, that a test did not run and why.
pub fn skip(test: &str, reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {reason}");
}
