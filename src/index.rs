//! Which watched locks name which holder pod, kept from the lock watch's
//! events, so that a terminal pod finds its locks without walking them all.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::core::PartialObjectMeta;
use kube::ResourceExt;

use crate::kinds::{self, Judged, Object};
use crate::lock::LockKey;

/// A ConfigMap lock as its (metadata-only) watch reads it.
type ConfigMapMeta = PartialObjectMeta<ConfigMap>;

/// What a scope's lock watch keeps for one kind, so that a terminal pod
/// finds its locks without walking them all.
pub trait Index<K>: Default + Send + Sync + 'static {
    /// A lock was listed, created or changed.
    fn apply(&self, lock: &K);
    fn delete(&self, key: &LockKey);
    /// A re-list starts: what it does not list again is gone at its end (a
    /// lock deleted while the watch was down).
    fn relist_started(&self);
    fn relist_done(&self);
    /// Whether a re-list is under way (the watch's store still holds the
    /// copy from before it).
    fn relisting(&self) -> bool;
}

/// The locks a re-list has listed so far, while one is under way.
struct Relist<T>(Option<HashSet<T>>);

impl<T> Default for Relist<T> {
    fn default() -> Self {
        Relist(None)
    }
}

impl<T: std::hash::Hash + Eq + Clone> Relist<T> {
    fn start(&mut self) {
        self.0 = Some(HashSet::new());
    }

    fn saw(&mut self, key: &T) {
        if let Some(seen) = self.0.as_mut() {
            seen.insert(key.clone());
        }
    }

    /// The re-list is done: of `indexed`, what it did not list.
    fn done<'a>(&mut self, indexed: impl Iterator<Item = &'a T>) -> Vec<T>
    where
        T: 'a,
    {
        match self.0.take() {
            Some(seen) => indexed.filter(|k| !seen.contains(*k)).cloned().collect(),
            None => Vec::new(),
        }
    }
}

/// The pods one lock names, as (name, uid): usually one.
type Holders = Box<[(Box<str>, Box<str>)]>;

/// Kept for every watched lock, so it is compact (10,000 locks in the memory
/// budget): each lock's key is stored once and shared, and the reverse map
/// is keyed by a hash of (namespace, uid). A hash that collides only brings
/// more candidates, which `locks_of` checks against the lock's own holders.
#[derive(Default)]
struct Inner {
    hasher: RandomState,
    by_lock: HashMap<Arc<LockKey>, Holders>,
    /// hash(namespace, holder uid) -> the locks that may name it.
    by_holder: HashMap<u64, Vec<Arc<LockKey>>>,
    relisting: Relist<Arc<LockKey>>,
}

impl Inner {
    fn hash(&self, namespace: &str, s: &str) -> u64 {
        self.hasher.hash_one((namespace, s))
    }
}

/// The holder index of one scope's ConfigMaps: the pods a lock held for
/// life names by ownerReference, and the hosts a leader record names.
#[derive(Default)]
pub struct HolderIndex {
    inner: Mutex<Inner>,
    /// ConfigMaps judged by a renewed record: the host its holder names.
    hosts: LeaseIndex,
}

impl HolderIndex {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut crate::locked(&self.inner))
    }

    /// Indexes every Pod a lock names.
    pub fn apply_owners<K: kube::Resource>(&self, lock: &K) {
        let key = LockKey::configmap(lock.namespace().unwrap_or_default(), lock.name_any());
        let holders: Holders = lock
            .owner_references()
            .iter()
            // A name no pod can have names no holder (the lock is
            // unmanageable, `OwnerNameNotAPod`): nothing for a sweep to ask.
            .filter(|o| o.kind == "Pod" && !o.uid.is_empty() && crate::dns_subdomain(&o.name))
            .map(|o| (o.name.as_str().into(), o.uid.as_str().into()))
            .collect();
        self.with(|i| {
            // The key already stored, if any, is kept and shared.
            let key = match i.by_lock.get_key_value(&key) {
                Some((k, _)) => k.clone(),
                None => Arc::new(key),
            };
            i.relisting.saw(&key);
            if i.by_lock.get(&key) == Some(&holders) {
                return;
            }
            unindex(i, &key);
            for (_, uid) in holders.iter() {
                let h = i.hash(&key.namespace, uid);
                let keys = i.by_holder.entry(h).or_default();
                if !keys.iter().any(|k| Arc::ptr_eq(k, &key)) {
                    keys.push(key.clone());
                }
            }
            i.by_lock.insert(key, holders);
        });
    }

    /// The locks that name the pod with this uid in this namespace.
    pub fn locks_of(&self, namespace: &str, uid: &str) -> Vec<LockKey> {
        self.with(|i| {
            let Some(keys) = i.by_holder.get(&i.hash(namespace, uid)) else {
                return Vec::new();
            };
            keys.iter()
                .filter(|k| {
                    k.namespace == namespace
                        && i.by_lock
                            .get(*k)
                            .is_some_and(|hs| hs.iter().any(|(_, u)| &**u == uid))
                })
                .map(|k| LockKey::clone(k))
                .collect()
        })
    }

    /// The locks for which `holder_is_there(namespace, name, uid)` is false
    /// for some pod they name.
    pub fn missing_holders(
        &self,
        mut holder_is_there: impl FnMut(&str, &str, &str) -> bool,
    ) -> Vec<LockKey> {
        self.with(|i| {
            i.by_lock
                .iter()
                .filter(|(k, hs)| {
                    !hs.iter()
                        .all(|(name, uid)| holder_is_there(&k.namespace, name, uid))
                })
                .map(|(k, _)| LockKey::clone(k))
                .collect()
        })
    }

    /// Per namespace, every host some leader record names.
    pub fn hosts(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.hosts.hosts()
    }

    /// The ConfigMaps whose leader record a pod of this name may hold (by
    /// its name, or its hostname when the name is longer than one).
    pub fn locks_named(&self, namespace: &str, pod: &str) -> Vec<LockKey> {
        self.hosts.leases_of(namespace, pod)
    }

    /// Per namespace, the name of every pod some lock names (what a sweep
    /// asks about).
    pub fn holder_names(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<_, BTreeSet<_>> = BTreeMap::new();
        self.with(|i| {
            for (k, hs) in &i.by_lock {
                let names = out.entry(k.namespace.clone()).or_default();
                names.extend(hs.iter().map(|(name, _)| name.to_string()));
            }
        });
        out
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.with(|i| i.by_lock.len())
    }
}

impl Index<ConfigMapMeta> for HolderIndex {
    /// By what its kind judges it by: the owner pods, or the host its
    /// leader record names (and never both: a lock that changed kind
    /// leaves the other).
    fn apply(&self, lock: &ConfigMapMeta) {
        let o = Object::ConfigMapMeta(&lock.metadata);
        let kind = kinds::of(o);
        let key = LockKey::configmap(lock.namespace().unwrap_or_default(), lock.name_any());
        if kind.judged() == Judged::ByRenewals {
            self.with(|i| unindex(i, &key));
            self.hosts.apply_host(key, kind.holder(o).map(|h| h.name));
        } else {
            self.hosts.delete(&key);
            self.apply_owners(lock)
        }
    }

    fn delete(&self, key: &LockKey) {
        self.with(|i| unindex(i, key));
        self.hosts.delete(key);
    }

    fn relist_started(&self) {
        self.with(|i| i.relisting.start());
        self.hosts.relist_started();
    }

    fn relist_done(&self) {
        self.with(|i| {
            for k in i.relisting.done(i.by_lock.keys()) {
                unindex(i, &k);
            }
        });
        self.hosts.relist_done();
    }

    fn relisting(&self) -> bool {
        self.with(|i| i.relisting.0.is_some()) || self.hosts.relisting()
    }
}

fn unindex(i: &mut Inner, key: &LockKey) {
    let Some(holders) = i.by_lock.remove(key) else {
        return;
    };
    for (_, uid) in holders.iter() {
        let h = i.hash(&key.namespace, uid);
        if let Some(keys) = i.by_holder.get_mut(&h) {
            keys.retain(|k| **k != *key);
            if keys.is_empty() {
                i.by_holder.remove(&h);
            }
        }
    }
}

/// Which watched Leases name which host (the pod name or hostname their
/// holder identity gives), so that a terminal pod finds its Leases by name.
#[derive(Default)]
pub struct LeaseIndex {
    inner: Mutex<LeaseInner>,
}

#[derive(Default)]
struct LeaseInner {
    by_host: HashMap<(String, String), HashSet<LockKey>>,
    by_lease: HashMap<LockKey, (String, String)>,
    /// A Lease held for life -> its owner pod's (name, uid): a sweep asks
    /// whether that pod is still there, as it asks of a ConfigMap's holder.
    owners: HashMap<LockKey, (String, String)>,
    relisting: Relist<LockKey>,
}

impl LeaseIndex {
    fn with<T>(&self, f: impl FnOnce(&mut LeaseInner) -> T) -> T {
        f(&mut crate::locked(&self.inner))
    }

    /// Indexes the host a Lease's holder identity names.
    pub fn apply_host(&self, key: LockKey, host: Option<String>) {
        self.apply_owned(key, host, None)
    }

    /// Indexes the host a Lease names and, for a Lease held for life, its
    /// owner pod's (name, uid).
    fn apply_owned(&self, key: LockKey, host: Option<String>, owner: Option<(String, String)>) {
        self.with(|i| {
            i.relisting.saw(&key);
            unindex_lease(i, &key);
            if let Some(h) = host {
                let id = (key.namespace.clone(), h);
                i.by_host.entry(id.clone()).or_default().insert(key.clone());
                i.by_lease.insert(key.clone(), id);
            }
            if let Some(o) = owner {
                i.owners.insert(key, o);
            }
        })
    }

    /// Per namespace, the name of every owner pod of a Lease held for life
    /// (what a sweep asks about, with the ConfigMap holders).
    pub fn owner_names(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<_, BTreeSet<_>> = BTreeMap::new();
        self.with(|i| {
            for (k, (name, _)) in &i.owners {
                out.entry(k.namespace.clone())
                    .or_default()
                    .insert(name.clone());
            }
        });
        out
    }

    /// The Leases held for life whose owner `owner_is_there(namespace,
    /// name, uid)` says is not there (`HolderIndex::missing_holders`).
    pub fn missing_owners(
        &self,
        mut owner_is_there: impl FnMut(&str, &str, &str) -> bool,
    ) -> Vec<LockKey> {
        self.with(|i| {
            i.owners
                .iter()
                .filter(|(k, (name, uid))| !owner_is_there(&k.namespace, name, uid))
                .map(|(k, _)| k.clone())
                .collect()
        })
    }

    /// Per namespace, every host some Lease names.
    pub fn hosts(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<_, BTreeSet<_>> = BTreeMap::new();
        self.with(|i| {
            for (ns, host) in i.by_host.keys() {
                out.entry(ns.clone()).or_default().insert(host.clone());
            }
        });
        out
    }

    /// The Leases a pod of this name may hold: by its name, and by its
    /// hostname when the name is longer than a hostname can be (a pod with
    /// its own `spec.hostname` is found by the resync sweep).
    pub fn leases_of(&self, namespace: &str, pod: &str) -> Vec<LockKey> {
        let host = crate::lock::lease::host_of_name(pod);
        self.with(|i| {
            let mut out: Vec<LockKey> = Vec::new();
            for h in [pod, host.as_str()] {
                if let Some(keys) = i.by_host.get(&(namespace.to_owned(), h.to_owned())) {
                    out.extend(keys.iter().cloned());
                }
            }
            out.sort();
            out.dedup();
            out
        })
    }
}

impl Index<Lease> for LeaseIndex {
    fn apply(&self, lease: &Lease) {
        let key = LockKey::lease(lease.namespace().unwrap_or_default(), lease.name_any());
        // A Lease held for life names its holder by its owner, whose name
        // and uid a sweep checks (a name no pod can have names none).
        let o = Object::Lease(lease);
        let kind = kinds::of(o);
        if kind.judged() == Judged::ByOwner {
            let owner = kind.holder(o).map(|h| (h.name, h.uid));
            let host = owner.as_ref().map(|(name, _)| name.clone());
            let owner = owner.filter(|(name, uid)| !uid.is_empty() && crate::dns_subdomain(name));
            self.apply_owned(key, host, owner);
        } else {
            let host = crate::lock::lease::parse(lease).ok().and_then(|p| p.host);
            self.apply_host(key, host);
        }
    }

    fn delete(&self, key: &LockKey) {
        self.with(|i| unindex_lease(i, key))
    }

    fn relist_started(&self) {
        self.with(|i| i.relisting.start());
    }

    fn relist_done(&self) {
        self.with(|i| {
            for k in i.relisting.done(i.by_lease.keys()) {
                unindex_lease(i, &k);
            }
        })
    }

    fn relisting(&self) -> bool {
        self.with(|i| i.relisting.0.is_some())
    }
}

fn unindex_lease(i: &mut LeaseInner, key: &LockKey) {
    i.owners.remove(key);
    if let Some(id) = i.by_lease.remove(key) {
        if let Some(keys) = i.by_host.get_mut(&id) {
            keys.remove(key);
            if keys.is_empty() {
                i.by_host.remove(&id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{lock_meta, pod_owner};
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(name: &str, owners: &[(&str, &str)]) -> ConfigMap {
        let mut meta = lock_meta(owners.iter().map(|(n, u)| pod_owner(n, u)).collect(), &[]);
        meta.name = Some(name.into());
        ConfigMap {
            metadata: meta,
            ..Default::default()
        }
    }

    fn key(name: &str) -> LockKey {
        LockKey::configmap("ops", name)
    }

    #[test]
    fn follows_the_lock_watch() {
        let idx = HolderIndex::default();
        idx.apply_owners(&cm("a", &[("p1", "u1")]));
        idx.apply_owners(&cm("b", &[("p1", "u1")]));
        idx.apply_owners(&cm("c", &[("p2", "u2"), ("p3", "u3")]));
        let mut of_u1 = idx.locks_of("ops", "u1");
        of_u1.sort();
        assert_eq!(of_u1, vec![key("a"), key("b")]);
        assert_eq!(idx.locks_of("ops", "u3"), vec![key("c")]);
        assert!(idx.locks_of("other", "u1").is_empty());

        // A takeover: the lock now names another pod.
        idx.apply_owners(&cm("a", &[("p9", "u9")]));
        assert_eq!(idx.locks_of("ops", "u1"), vec![key("b")]);
        assert_eq!(idx.locks_of("ops", "u9"), vec![key("a")]);

        let names = |idx: &HolderIndex| idx.holder_names().remove("ops").unwrap_or_default();
        assert!(names(&idx).contains("p1") && names(&idx).contains("p9"));
        idx.delete(&key("b"));
        assert!(idx.locks_of("ops", "u1").is_empty());
        assert!(!names(&idx).contains("p1"));

        // A re-list that no longer lists "c" forgets it.
        idx.relist_started();
        idx.apply_owners(&cm("a", &[("p9", "u9")]));
        idx.relist_done();
        assert!(idx.locks_of("ops", "u2").is_empty());
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn a_lease_relist_forgets_what_it_no_longer_lists() {
        let idx = LeaseIndex::default();
        let (a, b) = (LockKey::lease("ops", "a"), LockKey::lease("ops", "b"));
        idx.apply_host(a.clone(), Some("op-0".into()));
        idx.apply_host(b.clone(), Some("op-1".into()));
        idx.relist_started();
        idx.apply_host(a.clone(), Some("op-0".into()));
        idx.relist_done();
        assert_eq!(idx.leases_of("ops", "op-0"), vec![a]);
        assert!(idx.leases_of("ops", "op-1").is_empty());
        assert_eq!(idx.hosts()["ops"].len(), 1);
    }

    /// A Lease held for life: its owner's name and uid are kept for the
    /// sweep, and forgotten when the Lease is renewed or deleted.
    #[test]
    fn a_lease_held_for_life_keeps_its_owner() {
        use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
        let for_life = |name: &str, owner: &str, uid: &str| Lease {
            metadata: {
                let mut m = lock_meta(vec![pod_owner(owner, uid)], &[]);
                m.name = Some(name.into());
                m
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(owner.into()),
                ..Default::default()
            }),
        };
        let idx = LeaseIndex::default();
        let (a, b) = (LockKey::lease("ops", "a"), LockKey::lease("ops", "b"));
        Index::apply(&idx, &for_life("a", "op-0", "u0"));
        Index::apply(&idx, &for_life("b", "op-1", "u1"));
        assert_eq!(idx.owner_names()["ops"].len(), 2);
        assert_eq!(idx.leases_of("ops", "op-0"), vec![a.clone()]);
        // op-0 is there under its uid; op-1 is there under another.
        let mut missing = idx.missing_owners(|ns, name, uid| {
            ns == "ops" && ((name, uid) == ("op-0", "u0") || (name, uid) == ("op-1", "u9"))
        });
        missing.sort();
        assert_eq!(missing, vec![b.clone()]);
        // Renewed, it is no Lease held for life any more.
        let mut renewed = for_life("b", "op-1", "u1");
        renewed.spec.as_mut().unwrap().renew_time =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                k8s_openapi::jiff::Timestamp::now(),
            ));
        renewed.spec.as_mut().unwrap().lease_duration_seconds = Some(15);
        Index::apply(&idx, &renewed);
        assert!(idx.missing_owners(|_, _, _| false).contains(&a));
        assert!(!idx.missing_owners(|_, _, _| false).contains(&b));
        Index::delete(&idx, &a);
        assert!(idx.missing_owners(|_, _, _| false).is_empty());
        assert!(idx.owner_names().is_empty());
    }
}
