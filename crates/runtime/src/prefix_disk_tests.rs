use super::*;
use crate::prefix::tests::snap;

/// A fresh folder, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("strata-prefix-disk-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }

    /// The cache files there.
    fn files(&self, ext: &str) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = (std::fs::read_dir(self.0.join("k")).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(ext))
            .collect();
        found.sort();
        found
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(s: &Scratch, budget: u64, recurrent: bool) -> PrefixDisk {
    let template = snap(&[], recurrent, &[]).cache;
    PrefixDisk::open(&s.0, "k", budget, &template).unwrap()
}

fn put(d: &mut PrefixDisk, tokens: &[u32], recurrent: bool, marks: &[usize]) {
    d.insert(&Arc::new(snap(tokens, recurrent, marks)));
    d.flush();
}

#[test]
fn a_snapshot_comes_back_whole_after_a_restart() {
    let s = Scratch::new("restart");
    let mut d = open(&s, 1 << 20, true);
    put(&mut d, &[1, 2, 3, 4, 5, 6], true, &[2, 4]);
    assert_eq!(s.files(".pc").len(), 1);
    drop(d);
    let mut d = open(&s, 1 << 20, true);
    assert_eq!(d.stats().entries, 1);
    let want = snap(&[1, 2, 3, 4, 5, 6], true, &[2, 4]);
    let (got, n) = d.lookup(&[1, 2, 3, 4, 5, 6, 7], 6, 0).unwrap();
    assert_eq!(n, 6);
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.marks, want.marks);
    for (a, b) in got.cache.layers.iter().zip(&want.cache.layers) {
        assert_eq!(
            (&a.k, &a.v, &a.recurrent, &a.conv),
            (&b.k, &b.v, &b.recurrent, &b.conv)
        );
    }
    // At a mark, and only when it beats what memory has.
    assert_eq!(d.lookup(&[1, 2, 3, 9], 3, 0).map(|r| r.1), Some(2));
    assert!(d.lookup(&[1, 2, 3, 9], 3, 2).is_none());
    assert_eq!(d.stats().hits, 2);
}

#[test]
fn broken_and_foreign_files_are_misses_and_removed() {
    let s = Scratch::new("broken");
    let mut d = open(&s, 1 << 20, false);
    put(&mut d, &[1, 2, 3, 4], false, &[]);
    put(&mut d, &[7, 8, 9], false, &[]);
    drop(d);
    let files = s.files(".pc");
    assert_eq!(files.len(), 2);
    // One altered in its values (found when read), one cut short, and a stranger.
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() - 12;
    bytes[at] ^= 1;
    std::fs::write(&files[0], &bytes).unwrap();
    let bytes = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &bytes[..bytes.len() - 5]).unwrap();
    std::fs::write(s.0.join("k/junk.pc"), b"not a cache file at all").unwrap();
    let other = snap(&[5, 5], false, &[]);
    std::fs::write(s.0.join("k/other.pc"), {
        let mut f = MAGIC.to_vec();
        let h = header("another", &other);
        f.extend(VERSION.to_le_bytes());
        f.extend((h.len() as u32).to_le_bytes());
        f.extend(h);
        f
    })
    .unwrap();
    let mut d = open(&s, 1 << 20, false);
    d.flush();
    assert_eq!(
        d.stats().entries,
        2,
        "the stranger and the foreign file went at once"
    );
    assert!(d.lookup(&[1, 2, 3, 4, 5], 4, 0).is_none());
    assert!(d.lookup(&[7, 8, 9, 5], 3, 0).is_none());
    d.flush();
    assert_eq!(d.stats(), PrefixDiskStats::default());
    assert!(s.files(".pc").is_empty());
    // A good one still works after them.
    put(&mut d, &[1, 2, 3, 4], false, &[]);
    assert_eq!(d.lookup(&[1, 2, 3, 4, 5], 4, 0).map(|r| r.1), Some(4));
}

#[test]
fn the_budget_holds_least_recently_used_first_and_covered_files_go() {
    let s = Scratch::new("budget");
    let one = {
        let mut d = open(&s, 1 << 20, false);
        put(&mut d, &[1, 2, 3, 4], false, &[]);
        d.stats().bytes
    };
    let _ = std::fs::remove_dir_all(&s.0);
    let mut d = open(&s, 2 * one + one / 2, false);
    put(&mut d, &[1, 2, 3, 4], false, &[]);
    put(&mut d, &[5, 6, 7, 8], false, &[]);
    assert!(d.lookup(&[1, 2, 3, 4, 0], 4, 0).is_some()); // 1.. used last
    put(&mut d, &[9, 9, 9, 9], false, &[]);
    assert_eq!(d.stats().entries, 2);
    assert!(
        d.lookup(&[5, 6, 7, 8, 0], 4, 0).is_none(),
        "the least recently used went"
    );
    assert_eq!(s.files(".pc").len(), 2);
    // A longer conversation stands for its beginning.
    put(&mut d, &[1, 2, 3, 4, 5], false, &[]);
    assert_eq!(d.stats().entries, 2);
    assert_eq!(d.lookup(&[1, 2, 3, 4, 5, 6], 5, 0).map(|r| r.1), Some(5));
    assert_eq!(s.files(".pc").len(), 2);
}

#[test]
fn a_dead_process_s_temporary_files_are_removed() {
    let s = Scratch::new("tmp");
    drop(open(&s, 1 << 20, false));
    let dead = s.0.join("k/abc.999999999.tmp");
    // Our own pid's: a crashed run that had it (a container restarts with the same pid).
    let ours = s.0.join(format!("k/abc.{}.tmp", std::process::id()));
    let live =
        s.0.join(format!("k/abc.{}.tmp", std::os::unix::process::parent_id()));
    for f in [&dead, &ours, &live] {
        std::fs::write(f, b"half").unwrap();
    }
    drop(open(&s, 1 << 20, false));
    assert!(!dead.exists() && !ours.exists());
    assert!(live.exists(), "another live process's write is left alone");
}
