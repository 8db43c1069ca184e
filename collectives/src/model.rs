//! The bandwidth model: what rate each destination receives at under a
//! [`TreePlan`] on a [`Topology`].
//!
//! The paper (Takahashi et al. §3.1) labels each transfer tree with its
//! throughput and calls a set of trees *feasible* when the throughput on
//! every (directed) link is within its capacity; switches never limit
//! (§3.1, §4.1). It does not spell out how its simulator shares a link
//! among transfers, so this model uses the standard rule, **max-min fair
//! sharing by progressive filling**, with one constraint that makes a relay
//! a relay:
//!
//! - every overlay edge of every tree is a *flow* crossing the arcs of its
//!   path (an arc crossed twice counts twice);
//! - all flows start at rate 0 and rise together; a flow stops rising when
//!   an arc it crosses is full, when it reaches its tree's planned
//!   throughput (if the plan gives one), or when the flow feeding its sender
//!   in the same tree stops — a node cannot forward a tree's data faster
//!   than it receives it;
//! - a destination's bandwidth is the sum over trees of the rate of the
//!   flow into it (different trees carry different data).
//!
//! For a plan of Algorithm 1 the planned throughputs are feasible, so every
//! tree runs at exactly `u_i` and `d` gets `w(d)` (eq. 8). For a single
//! pipeline every node gets the narrowest link's capacity ("the throughput
//! of a pipeline is limited by the narrowest link in it", §2.3); for a flat
//! tree the source's link is split among the destinations ("if a node has N
//! children, these children can only receive 1/N bandwidth each", §2.2).

use std::collections::BTreeMap;

use crate::error::CollectiveError;
use crate::stable::{TreePlan, tree_depths};
use crate::topology::{ArcId, NodeId, Topology};

/// The model's answer for a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Bandwidths {
    /// Each destination's total receiving rate.
    pub destination: BTreeMap<NodeId, f64>,
    /// Per tree, the rate of the flow into each node it reaches.
    pub tree_rates: Vec<BTreeMap<NodeId, f64>>,
    /// The total rate on each arc.
    pub arc_load: Vec<f64>,
}

impl Bandwidths {
    /// The aggregate bandwidth: the sum over destinations (§1).
    pub fn aggregate(&self) -> f64 {
        self.destination.values().sum()
    }
}

struct Flow {
    tree: usize,
    to: NodeId,
    arcs: Vec<(ArcId, f64)>,
    parent: Option<usize>,
    cap: Option<f64>,
}

/// Rates under max-min fair sharing with relays (see the module docs).
pub fn model_bandwidth(
    topology: &Topology,
    plan: &TreePlan,
) -> Result<Bandwidths, CollectiveError> {
    topology.check_broadcast(plan.source, &plan.destinations)?;
    let mut flows: Vec<Flow> = Vec::new();
    for (t, tree) in plan.trees.iter().enumerate() {
        tree_depths(plan, t)?; // well-formed: parents before children
        let mut into: BTreeMap<NodeId, usize> = BTreeMap::new();
        for &(from, to) in &tree.edges {
            let mut arcs: BTreeMap<ArcId, f64> = BTreeMap::new();
            for arc in topology
                .path(from, to)
                .ok_or(CollectiveError::Unreachable(to))?
            {
                *arcs.entry(arc).or_insert(0.0) += 1.0;
            }
            into.insert(to, flows.len());
            flows.push(Flow {
                tree: t,
                to,
                arcs: arcs.into_iter().collect(),
                parent: into.get(&from).copied(),
                cap: tree.throughput.map(|u| u as f64),
            });
        }
    }

    let capacity: Vec<f64> = (0..topology.arc_count())
        .map(|a| topology.arc_capacity(a) as f64)
        .collect();
    let eps = |c: f64| 1e-9 * c.max(1.0);
    let mut rate = vec![0.0f64; flows.len()];
    let mut frozen = vec![false; flows.len()];
    let load_of = |rate: &[f64]| {
        let mut load = vec![0.0f64; capacity.len()];
        for (f, flow) in flows.iter().enumerate() {
            for &(a, times) in &flow.arcs {
                load[a] += rate[f] * times;
            }
        }
        load
    };
    for _round in 0..=flows.len() {
        if frozen.iter().all(|&x| x) {
            break;
        }
        let load = load_of(&rate);
        let mut weight = vec![0.0f64; capacity.len()];
        for (f, flow) in flows.iter().enumerate() {
            if !frozen[f] {
                for &(a, times) in &flow.arcs {
                    weight[a] += times;
                }
            }
        }
        let mut delta = f64::INFINITY;
        for a in 0..capacity.len() {
            if weight[a] > 0.0 {
                delta = delta.min((capacity[a] - load[a]).max(0.0) / weight[a]);
            }
        }
        for (f, flow) in flows.iter().enumerate() {
            if let (false, Some(cap)) = (frozen[f], flow.cap) {
                delta = delta.min((cap - rate[f]).max(0.0));
            }
        }
        if !delta.is_finite() {
            break; // only flows that cross no arc remain; cannot happen
        }
        for f in 0..flows.len() {
            if !frozen[f] {
                rate[f] += delta;
            }
        }
        let load = load_of(&rate);
        let full: Vec<bool> = (0..capacity.len())
            .map(|a| capacity[a] - load[a] <= eps(capacity[a]))
            .collect();
        for (f, flow) in flows.iter().enumerate() {
            if frozen[f] {
                continue;
            }
            let capped = flow.cap.is_some_and(|c| rate[f] >= c - eps(c));
            if capped || flow.arcs.iter().any(|&(a, _)| full[a]) {
                frozen[f] = true;
            }
        }
        // A child cannot outrun its parent: flows are listed parents first.
        for f in 0..flows.len() {
            if flows[f].parent.is_some_and(|p| frozen[p]) {
                frozen[f] = true;
            }
        }
    }

    let mut destination: BTreeMap<NodeId, f64> =
        plan.destinations.iter().map(|&d| (d, 0.0)).collect();
    let mut tree_rates = vec![BTreeMap::new(); plan.trees.len()];
    for (f, flow) in flows.iter().enumerate() {
        tree_rates[flow.tree].insert(flow.to, rate[f]);
        if let Some(total) = destination.get_mut(&flow.to) {
            *total += rate[f];
        }
    }
    Ok(Bandwidths {
        destination,
        tree_rates,
        arc_load: load_of(&rate),
    })
}
