//! A real HTTP server for the remote-model tests: nginx (from the distribution's package,
//! installed by `.ci/run`) on a loopback port, serving fixture folders under
//! `/{org}/{name}/resolve/{revision}/` as the Hugging Face hub lays them out, with an
//! `X-Repo-Commit` header.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

pub struct Nginx {
    pub port: u16,
    pub root: PathBuf,
    child: Option<Child>,
    conf: PathBuf,
}

fn nginx_bin() -> PathBuf {
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx"] {
        if Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("nginx is not installed (apt-get install nginx; .ci/run does it)");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Nginx {
    /// Serves each (repo, folder) as `/{repo}/resolve/main/` and `/{repo}/resolve/{COMMIT}/`.
    pub fn start(tag: &str, repos: &[(&str, &Path)]) -> Nginx {
        let root = std::env::temp_dir().join(format!("strata-nginx-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let www = root.join("www");
        for (repo, dir) in repos {
            let resolve = www.join(repo).join("resolve");
            std::fs::create_dir_all(&resolve).unwrap();
            for rev in ["main", COMMIT] {
                std::os::unix::fs::symlink(dir, resolve.join(rev)).unwrap();
            }
        }
        let port = free_port();
        let conf = root.join("nginx.conf");
        let r = root.display();
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\npid {r}/nginx.pid;\nerror_log {r}/error.log;\n{}\
                 events {{ worker_connections 256; }}\n\
                 http {{\n  log_format ranged '$status $request_uri range=$http_range auth=$http_authorization';\n  access_log {r}/access.log ranged;\n  client_body_temp_path {r}/tmp;\n  proxy_temp_path {r}/tmp;\n\
                   fastcgi_temp_path {r}/tmp;\n  uwsgi_temp_path {r}/tmp;\n  scgi_temp_path {r}/tmp;\n\
                   default_type application/octet-stream;\n\
                   server {{\n    listen 127.0.0.1:{port};\n    root {r}/www;\n\
                     location / {{ add_header X-Repo-Commit {COMMIT} always; }}\n  }}\n}}\n",
                // As root, workers would switch to an unprivileged user that may not read the
                // fixtures; keep them as the caller.
                if unsafe { libc_geteuid() } == 0 { "user root;\n" } else { "" }
            ),
        )
        .unwrap();
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        let mut n = Nginx {
            port,
            root,
            child: None,
            conf,
        };
        n.resume();
        n
    }

    /// Starts (again) on the same port.
    pub fn resume(&mut self) {
        let child = Command::new(nginx_bin())
            .args([
                "-c",
                self.conf.to_str().unwrap(),
                "-p",
                self.root.to_str().unwrap(),
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start nginx");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nginx did not start: {}",
                self.error_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.root.join("error.log")).unwrap_or_default()
    }

    /// Requests in the access log so far whose line contains `needle`.
    pub fn requests(&self, needle: &str) -> usize {
        std::fs::read_to_string(self.root.join("access.log"))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(needle))
            .count()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}
