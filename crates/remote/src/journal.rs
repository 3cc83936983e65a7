//! Which byte runs of a sparse cached shard are present: an append-only journal beside it
//! (`NAME.strata-runs`) of fixed 32-byte records `magic | offset | len | xxh3(data) | check`.
//!
//! Crash safety: a run's bytes are written and synced before its record is appended and synced,
//! so a record always describes bytes already on disk. A record torn by a crash fails its own
//! check and is dropped, with everything after it, when the journal is next opened. Concurrent
//! processes append under an exclusive `flock`, and re-read the journal under the same lock, so
//! none trusts a run another has not finished.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

const MAGIC: u32 = 0x4e55_5253; // "SRUN"
const RECORD: usize = 32;

/// A present run and the checksum of its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub offset: u64,
    pub len: u64,
    pub xxh3: u64,
}

fn check_of(bytes: &[u8]) -> u32 {
    xxhash_rust::xxh3::xxh3_64(bytes) as u32
}

fn encode(run: &Run) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    r[4..12].copy_from_slice(&run.offset.to_le_bytes());
    r[12..20].copy_from_slice(&run.len.to_le_bytes());
    r[20..28].copy_from_slice(&run.xxh3.to_le_bytes());
    let c = check_of(&r[..28]);
    r[28..32].copy_from_slice(&c.to_le_bytes());
    r
}

fn decode(r: &[u8]) -> Option<Run> {
    let word = |a: usize, b: usize| u64::from_le_bytes(r[a..b].try_into().unwrap());
    if u32::from_le_bytes(r[0..4].try_into().unwrap()) != MAGIC
        || u32::from_le_bytes(r[28..32].try_into().unwrap()) != check_of(&r[..28])
    {
        return None;
    }
    let run = Run {
        offset: word(4, 12),
        len: word(12, 20),
        xxh3: word(20, 28),
    };
    // A run past u64::MAX is no run of a file (the checksum only says the record is whole).
    run.offset.checked_add(run.len).map(|_| run)
}

/// The runs of a journal's bytes: every whole valid record, up to the first that is not
/// (a torn tail); and how many bytes those records take.
pub fn decode_records(bytes: &[u8]) -> (Vec<Run>, usize) {
    let mut runs = Vec::new();
    for rec in bytes.chunks_exact(RECORD) {
        match decode(rec) {
            Some(run) => runs.push(run),
            None => break,
        }
    }
    let valid = runs.len() * RECORD;
    (runs, valid)
}

/// Holds an exclusive `flock` on a descriptor while alive (the file outlives it: both live in
/// the journal, the lock only within one of its methods).
struct Locked(std::os::unix::io::RawFd);

impl Locked {
    fn new(f: &File) -> std::io::Result<Locked> {
        let fd = f.as_raw_fd();
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(fd, libc::LOCK_EX) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Locked(fd))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: the descriptor is still open (see the type's comment).
        unsafe { libc::flock(self.0, libc::LOCK_UN) };
    }
}

pub struct Journal {
    path: PathBuf,
    file: File,
    /// Present runs by (offset, len), as recorded: they may overlap, touch or share a start.
    runs: BTreeMap<(u64, u64), Run>,
}

impl Journal {
    pub fn open(path: &Path) -> std::io::Result<Journal> {
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)?;
        let mut j = Journal {
            path: path.to_path_buf(),
            file,
            runs: BTreeMap::new(),
        };
        {
            let _lock = Locked::new(&j.file)?;
            j.reload()?;
        }
        Ok(j)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Re-reads every valid record; truncates a torn tail (call under the lock).
    fn reload(&mut self) -> std::io::Result<()> {
        let mut bytes = Vec::new();
        (&self.file).seek(SeekFrom::Start(0))?;
        (&self.file).read_to_end(&mut bytes)?;
        let (runs, valid) = decode_records(&bytes);
        self.runs = runs.into_iter().map(|r| ((r.offset, r.len), r)).collect();
        if valid < bytes.len() {
            self.file.set_len(valid as u64)?;
            self.file.sync_all()?;
        }
        Ok(())
    }

    /// Runs recorded (possibly by another process) since this journal was read.
    pub fn refresh(&mut self) -> std::io::Result<()> {
        let _lock = Locked::new(&self.file)?;
        self.reload()
    }

    pub fn runs(&self) -> impl Iterator<Item = &Run> {
        self.runs.values()
    }

    /// The parts of [offset, offset+len) no recorded run covers, in order.
    pub fn missing(&self, offset: u64, len: u64) -> Vec<(u64, u64)> {
        let end = offset.saturating_add(len);
        let mut gaps = Vec::new();
        let mut at = offset;
        // Runs starting before `end`, in order; one starting before `offset` may still cover it.
        for run in self.runs.range(..(end, 0)).map(|(_, r)| r) {
            let (s, e) = (run.offset, run.offset + run.len);
            if e <= at {
                continue;
            }
            if s > at {
                gaps.push((at, s.min(end) - at));
            }
            at = at.max(e);
            if at >= end {
                break;
            }
        }
        if at < end {
            gaps.push((at, end - at));
        }
        gaps
    }

    pub fn covered_bytes(&self) -> u64 {
        let mut total = 0;
        let mut at = 0;
        for run in self.runs.values() {
            let (s, e) = (run.offset, run.offset + run.len);
            if e > at {
                total += e - s.max(at);
                at = e;
            }
        }
        total
    }

    /// Forgets every run (the data file was created anew).
    pub fn reset(&mut self) -> std::io::Result<()> {
        let _lock = Locked::new(&self.file)?;
        self.file.set_len(0)?;
        self.file.sync_all()?;
        self.runs.clear();
        Ok(())
    }

    /// Drops the runs `keep` refuses, under the lock (appends by other processes are never
    /// lost): the records are rewritten in place; a crash midway leaves fewer runs trusted,
    /// never a wrong one. Returns how many were dropped.
    pub fn retain(&mut self, keep: impl Fn(&Run) -> bool) -> std::io::Result<usize> {
        let _lock = Locked::new(&self.file)?;
        self.reload()?;
        let kept: Vec<Run> = self.runs.values().filter(|r| keep(r)).copied().collect();
        let dropped = self.runs.len() - kept.len();
        if dropped == 0 {
            return Ok(0);
        }
        self.file.set_len(0)?;
        self.file.sync_all()?;
        let mut bytes = Vec::with_capacity(kept.len() * RECORD);
        for r in &kept {
            bytes.extend_from_slice(&encode(r));
        }
        (&self.file).write_all(&bytes)?;
        self.file.sync_data()?;
        self.runs = kept.into_iter().map(|r| ((r.offset, r.len), r)).collect();
        Ok(dropped)
    }

    /// Records a run whose bytes are already written and synced to the data file.
    pub fn append(&mut self, run: Run) -> std::io::Result<()> {
        let _lock = Locked::new(&self.file)?;
        self.reload()?;
        (&self.file).write_all(&encode(&run))?;
        self.file.sync_data()?;
        self.runs.insert((run.offset, run.len), run);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn retain_drops_runs_in_place_and_keeps_others_appends() {
        let dir = std::env::temp_dir().join(format!("strata-journal-retain-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("j");
        let mut a = Journal::open(&path).unwrap();
        let mut b = Journal::open(&path).unwrap();
        for (offset, len) in [(0, 8), (8, 100), (200, 50)] {
            a.append(Run {
                offset,
                len,
                xxh3: offset,
            })
            .unwrap();
        }
        // Another process appended since `b` read the journal: retain sees it too.
        a.append(Run {
            offset: 500,
            len: 10,
            xxh3: 1,
        })
        .unwrap();
        assert_eq!(b.retain(|r| r.offset != 8).unwrap(), 1);
        let reread = Journal::open(&path).unwrap();
        let offsets: Vec<u64> = reread.runs().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![0, 200, 500]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    use super::*;

    #[test]
    fn gaps_torn_records_and_reopening() {
        let dir = std::env::temp_dir().join(format!("strata-journal-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.strata-runs");
        let _ = std::fs::remove_file(&path);
        let mut j = Journal::open(&path).unwrap();
        assert_eq!(j.missing(10, 20), vec![(10, 20)]);
        j.append(Run {
            offset: 12,
            len: 5,
            xxh3: 1,
        })
        .unwrap();
        j.append(Run {
            offset: 20,
            len: 4,
            xxh3: 2,
        })
        .unwrap();
        assert_eq!(j.missing(10, 20), vec![(10, 2), (17, 3), (24, 6)]);
        assert_eq!(j.missing(12, 5), vec![]);
        assert_eq!(j.covered_bytes(), 9);
        // Runs that share a start are all kept (the longest covers).
        j.append(Run {
            offset: 12,
            len: 2,
            xxh3: 4,
        })
        .unwrap();
        assert_eq!(j.missing(12, 5), vec![]);
        assert_eq!(j.runs().count(), 3);
        // A torn record (a crash mid-append) is dropped on reopen, the rest kept.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(
            &encode(&Run {
                offset: 0,
                len: 100,
                xxh3: 3,
            })[..20],
        )
        .unwrap();
        drop(f);
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.runs().count(), 3);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 96);
        // A corrupted record ends the trusted prefix.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[40] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let j = Journal::open(&path).unwrap();
        assert_eq!(j.runs().count(), 1);
        assert_eq!(j.missing(12, 5), vec![]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
