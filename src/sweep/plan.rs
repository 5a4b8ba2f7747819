//! How a sweep reads each namespace, as learned from the sweep before:
//! the pages its lists took, against the pods its locks name.

use std::collections::{BTreeSet, HashMap};

/// A sweep's memory of what reading cost, for the next one to choose.
#[derive(Debug, Default)]
pub struct Plan {
    /// Per namespace: the pages its two lists took when last listed.
    pub(super) learned: HashMap<String, Pages>,
    /// Requests a sweep of the whole cluster at once takes (estimated or
    /// last seen), and at which sweep that was learned.
    pub(super) cluster_cost: Option<(usize, u64)>,
    pub(super) sweeps: u64,
}

/// Pages of a namespace's lists: its terminal pods, all its pods.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Pages {
    pub(super) terminal: usize,
    pub(super) all: usize,
}

/// How often (in sweeps) the cluster's size is asked again.
pub(super) const CLUSTER_COST_TTL: u64 = 12;

/// The pods one namespace's locks name.
#[derive(Debug, Default)]
pub(super) struct Named {
    /// ConfigMap holders: is each there, under its uid, and alive?
    pub(super) holders: BTreeSet<String>,
    /// Lease hosts: has one ended? A host may be a pod name cut to a
    /// hostname, which only a list finds (`LeaseIndex::leases_of`).
    pub(super) hosts: BTreeSet<String>,
}

/// How one namespace is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Reads {
    /// List its terminal pods (both kinds).
    pub(super) terminal: bool,
    /// List all its pods (the holders' presence).
    pub(super) all: bool,
    /// Read each ConfigMap holder by name instead.
    pub(super) by_name: bool,
}

impl Plan {
    /// How to read a namespace, and what it costs in requests: its Lease
    /// hosts by a list of its terminal pods (complete, usually one page);
    /// its ConfigMap holders by name or by listing, whichever took fewer
    /// requests (not listed yet: by name for one or two holders).
    pub(super) fn reads(&self, namespace: &str, named: &Named) -> (Reads, usize) {
        let learned = self.learned.get(namespace).copied();
        let pages = learned.unwrap_or(Pages {
            terminal: 1,
            all: 1,
        });
        let h = named.holders.len();
        if named.hosts.is_empty() {
            let list = match learned {
                Some(p) => p.terminal + p.all <= h,
                None => h > 2,
            };
            return if list {
                let r = Reads {
                    terminal: true,
                    all: true,
                    by_name: false,
                };
                (r, pages.terminal + pages.all)
            } else {
                let r = Reads {
                    terminal: false,
                    all: false,
                    by_name: true,
                };
                (r, h)
            };
        }
        // The terminal list is read anyway; the holders' presence by the
        // other list, or by name.
        let all = h > 0
            && match learned {
                Some(p) => p.all <= h,
                None => h > 2,
            };
        let by_name = h > 0 && !all;
        let cost = pages.terminal
            + if all {
                pages.all
            } else if by_name {
                h
            } else {
                0
            };
        let r = Reads {
            terminal: true,
            all,
            by_name,
        };
        (r, cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(holders: &[&str], hosts: &[&str]) -> Named {
        Named {
            holders: holders.iter().map(|s| s.to_string()).collect(),
            hosts: hosts.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// ConfigMap holders: by name when one or two and not listed yet, else
    /// by list; once listed, the cheaper of the lists' pages and the names.
    /// Lease hosts: always the terminal list (a cut hostname is found only
    /// there).
    #[test]
    fn reads_each_namespace_the_cheaper_way() {
        let (list, names, terminal_only) = (
            Reads {
                terminal: true,
                all: true,
                by_name: false,
            },
            Reads {
                terminal: false,
                all: false,
                by_name: true,
            },
            Reads {
                terminal: true,
                all: false,
                by_name: false,
            },
        );
        let mut plan = Plan::default();
        assert_eq!(plan.reads("ops", &named(&["a"], &[])), (names, 1));
        assert_eq!(plan.reads("ops", &named(&["a", "b"], &[])), (names, 2));
        assert_eq!(plan.reads("ops", &named(&["a", "b", "c"], &[])), (list, 2));
        assert_eq!(plan.reads("ops", &named(&[], &["h"])), (terminal_only, 1));
        let mixed = Reads {
            by_name: true,
            ..terminal_only
        };
        assert_eq!(plan.reads("ops", &named(&["a"], &["h"])), (mixed, 2));
        plan.learned.insert(
            "ops".into(),
            Pages {
                terminal: 2,
                all: 10,
            },
        );
        assert_eq!(plan.reads("ops", &named(&["a", "b", "c"], &[])), (names, 3));
        let twelve: Vec<String> = (0..12).map(|i| format!("p{i}")).collect();
        let twelve: Vec<&str> = twelve.iter().map(String::as_str).collect();
        assert_eq!(plan.reads("ops", &named(&twelve, &[])), (list, 12));
        let both = Reads {
            all: true,
            ..terminal_only
        };
        assert_eq!(plan.reads("ops", &named(&twelve, &["h"])), (both, 12));
    }
}
