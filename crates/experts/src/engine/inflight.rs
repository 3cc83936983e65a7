//! Reads in flight, deduplicated by key: whoever needs what a read brings (an expert, a streamed
//! layer's block) finds the read already queued or in flight and waits for it, instead of
//! issuing another. A slot is completed once, by the reader that finishes the read; waiters
//! either block on it or are told on a channel (to take results in the order they land).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex};

/// The result of one read, once it has landed; errors are messages (they are shared by every
/// waiter).
pub(crate) struct Slot<T> {
    state: Mutex<SlotState<T>>,
    done: Condvar,
}

struct SlotState<T> {
    result: Option<Result<T, String>>,
    /// Waiters to tell when the read completes: (channel, their index for it).
    listeners: Vec<(Sender<usize>, usize)>,
}

impl<T: Clone> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            state: Mutex::new(SlotState {
                result: None,
                listeners: Vec::new(),
            }),
            done: Condvar::new(),
        }
    }
}

impl<T: Clone> Slot<T> {
    /// The result if the read has landed; otherwise `notify` will receive `index` when it does.
    pub(crate) fn result_or_listen(&self, notify: &Sender<usize>, index: usize) -> Option<Result<T, String>> {
        let mut st = self.state.lock().expect("in-flight lock");
        if st.result.is_none() {
            st.listeners.push((notify.clone(), index));
        }
        st.result.clone()
    }

    /// The result if the read has landed.
    pub(crate) fn result(&self) -> Option<Result<T, String>> {
        self.state.lock().expect("in-flight lock").result.clone()
    }

    /// Blocks until the read has landed.
    pub(crate) fn wait(&self) -> Result<T, String> {
        let mut st = self.state.lock().expect("in-flight lock");
        loop {
            if let Some(result) = st.result.as_ref() {
                return result.clone();
            }
            st = self.done.wait(st).expect("in-flight wait");
        }
    }

    /// Records the result and tells every waiter.
    pub(crate) fn complete(&self, result: Result<T, String>) {
        let listeners = {
            let mut st = self.state.lock().expect("in-flight lock");
            st.result = Some(result);
            std::mem::take(&mut st.listeners)
        };
        self.done.notify_all();
        for (tx, index) in listeners {
            let _ = tx.send(index);
        }
    }
}

/// The reads in flight (or queued, or landed and still held) by key.
pub(crate) struct Table<K, V> {
    map: Mutex<HashMap<K, Arc<V>>>,
}

impl<K, V> Default for Table<K, V> {
    fn default() -> Self {
        Table {
            map: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Copy, V> Table<K, V> {
    /// The entry of `key`, or (`start` makes it, under the table's lock so no one else starts
    /// the same read) a new one; `true` when it is new.
    pub(crate) fn get_or_start(&self, key: K, start: impl FnOnce() -> Arc<V>) -> (Arc<V>, bool) {
        let mut map = self.map.lock().expect("in-flight table lock");
        if let Some(v) = map.get(&key) {
            return (v.clone(), false);
        }
        let v = start();
        map.insert(key, v.clone());
        (v, true)
    }

    pub(crate) fn get(&self, key: &K) -> Option<Arc<V>> {
        self.map.lock().expect("in-flight table lock").get(key).cloned()
    }

    pub(crate) fn remove(&self, key: &K) {
        self.map.lock().expect("in-flight table lock").remove(key);
    }

    /// Keeps only the entries `keep` accepts (the others' waiters still hold theirs).
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K) -> bool) {
        self.map
            .lock()
            .expect("in-flight table lock")
            .retain(|k, _| keep(k));
    }

    /// Every entry now.
    pub(crate) fn values(&self) -> Vec<Arc<V>> {
        self.map
            .lock()
            .expect("in-flight table lock")
            .values()
            .cloned()
            .collect()
    }

    /// Runs `f` on the entries of `keys` that exist, under one lock.
    pub(crate) fn each_of(&self, keys: impl IntoIterator<Item = K>, mut f: impl FnMut(K, Option<&Arc<V>>)) {
        let map = self.map.lock().expect("in-flight table lock");
        for k in keys {
            f(k, map.get(&k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;

    #[test]
    fn one_read_per_key_and_every_waiter_gets_its_result() {
        let table: Table<u32, Slot<u64>> = Table::default();
        let (a, new_a) = table.get_or_start(7, || Arc::new(Slot::default()));
        let (b, new_b) = table.get_or_start(7, || panic!("a second read of the same key"));
        assert!(new_a && !new_b && Arc::ptr_eq(&a, &b));
        let (tx, rx) = channel();
        assert!(a.result_or_listen(&tx, 3).is_none());
        let blocked = {
            let b = b.clone();
            std::thread::spawn(move || b.wait())
        };
        a.complete(Ok(42));
        assert_eq!(rx.recv().unwrap(), 3);
        assert_eq!(blocked.join().unwrap(), Ok(42));
        assert_eq!(b.result_or_listen(&tx, 4), Some(Ok(42)));
        table.remove(&7);
        assert!(table.get(&7).is_none());
        let (_, again) = table.get_or_start(7, || Arc::new(Slot::default()));
        assert!(again, "a removed key starts a new read");
    }

    #[test]
    fn errors_reach_every_waiter_and_retain_lets_go() {
        let table: Table<u32, Slot<u64>> = Table::default();
        for k in 0..4 {
            table.get_or_start(k, || Arc::new(Slot::default()));
        }
        let s = table.get(&2).unwrap();
        s.complete(Err("disk on fire".into()));
        assert_eq!(s.wait(), Err("disk on fire".to_string()));
        table.retain(|&k| k % 2 == 0);
        assert_eq!(table.values().len(), 2);
        let mut seen = Vec::new();
        table.each_of([0, 1, 2], |k, v| seen.push((k, v.is_some())));
        assert_eq!(seen, [(0, true), (1, false), (2, true)]);
    }
}
