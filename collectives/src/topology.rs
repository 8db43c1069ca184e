//! Bandwidth-annotated tree topologies (Takahashi et al. §3.1–3.2).
//!
//! Hosts and switches are nodes; a link joins two nodes, is full duplex,
//! and has the same capacity in both directions (the paper's condition for
//! stability and optimality, §3.1). Each link is modelled as two directed
//! *arcs* whose bandwidth is accounted for separately (§3.2: "each link is
//! bidirectional and modeled as two separate edges of the graph"). Switches
//! have "a sufficiently strong backplane" (§3.1): only links limit rates.
//!
//! [`Topology::connect`] refuses a link that would close a cycle, so a
//! topology is always a forest; a broadcast needs its source and
//! destinations in one tree of it.

use crate::error::CollectiveError;

/// A node of a [`Topology`]: its index in insertion order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub usize);

/// Whether a node computes or only forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A computer: can be a source, a destination or a relay.
    Host,
    /// A switch: forwards, never stores.
    Switch,
}

/// A full-duplex link with `capacity` in each direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// One end.
    pub a: NodeId,
    /// The other end.
    pub b: NodeId,
    /// The bandwidth in each direction, in any unit (> 0).
    pub capacity: u64,
}

/// A directed half of a link: arc `2·l` goes `a → b` of link `l`, arc
/// `2·l + 1` goes `b → a`.
pub type ArcId = usize;

/// A tree (forest) of hosts and switches joined by capacity-annotated links.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    kinds: Vec<NodeKind>,
    links: Vec<Link>,
    /// Per node: (neighbour, arc from this node to the neighbour).
    adjacency: Vec<Vec<(NodeId, ArcId)>>,
    /// Union-find parents, to refuse cycles.
    component: Vec<usize>,
}

impl Topology {
    /// An empty topology.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a host and returns its id.
    pub fn add_host(&mut self) -> NodeId {
        self.add(NodeKind::Host)
    }

    /// Adds a switch and returns its id.
    pub fn add_switch(&mut self) -> NodeId {
        self.add(NodeKind::Switch)
    }

    fn add(&mut self, kind: NodeKind) -> NodeId {
        let id = self.kinds.len();
        self.kinds.push(kind);
        self.adjacency.push(Vec::new());
        self.component.push(id);
        NodeId(id)
    }

    /// Joins `a` and `b` by a link of `capacity` in each direction and
    /// returns the link's index. Depth-first traversals visit a node's
    /// neighbours in the order their links were added.
    pub fn connect(
        &mut self,
        a: NodeId,
        b: NodeId,
        capacity: u64,
    ) -> Result<usize, CollectiveError> {
        self.check(a)?;
        self.check(b)?;
        if capacity == 0 {
            return Err(CollectiveError::ZeroCapacity { a, b });
        }
        let (ra, rb) = (self.find(a.0), self.find(b.0));
        if ra == rb {
            return Err(CollectiveError::Cycle { a, b });
        }
        self.component[ra] = rb;
        let l = self.links.len();
        self.links.push(Link { a, b, capacity });
        self.adjacency[a.0].push((b, 2 * l));
        self.adjacency[b.0].push((a, 2 * l + 1));
        Ok(l)
    }

    fn find(&mut self, mut x: usize) -> usize {
        while self.component[x] != x {
            self.component[x] = self.component[self.component[x]];
            x = self.component[x];
        }
        x
    }

    fn check(&self, n: NodeId) -> Result<(), CollectiveError> {
        if n.0 < self.kinds.len() {
            Ok(())
        } else {
            Err(CollectiveError::UnknownNode(n))
        }
    }

    /// The number of nodes.
    pub fn node_count(&self) -> usize {
        self.kinds.len()
    }

    /// The kind of `n`.
    ///
    /// # Panics
    /// If `n` is not a node of this topology.
    pub fn kind(&self, n: NodeId) -> NodeKind {
        self.kinds[n.0]
    }

    /// All hosts, in id order.
    pub fn hosts(&self) -> Vec<NodeId> {
        (0..self.kinds.len())
            .filter(|&i| self.kinds[i] == NodeKind::Host)
            .map(NodeId)
            .collect()
    }

    /// The links, by index.
    pub fn links(&self) -> &[Link] {
        &self.links
    }

    /// The number of arcs (two per link).
    pub fn arc_count(&self) -> usize {
        2 * self.links.len()
    }

    /// The capacity of an arc.
    pub fn arc_capacity(&self, arc: ArcId) -> u64 {
        self.links[arc / 2].capacity
    }

    /// The nodes an arc leaves and enters.
    pub fn arc_ends(&self, arc: ArcId) -> (NodeId, NodeId) {
        let link = self.links[arc / 2];
        if arc.is_multiple_of(2) {
            (link.a, link.b)
        } else {
            (link.b, link.a)
        }
    }

    /// `n`'s neighbours with the arc from `n` to each, in link order.
    pub(crate) fn neighbours(&self, n: NodeId) -> &[(NodeId, ArcId)] {
        &self.adjacency[n.0]
    }

    /// The arcs of the unique path `L(from, to)` (§3.4.2), in order, or
    /// `None` if the two are not connected.
    pub fn path(&self, from: NodeId, to: NodeId) -> Option<Vec<ArcId>> {
        // Parent arcs of a breadth-first search from `from`.
        let mut via: Vec<Option<ArcId>> = vec![None; self.kinds.len()];
        let mut seen = vec![false; self.kinds.len()];
        seen[from.0] = true;
        let mut queue = std::collections::VecDeque::from([from]);
        while let Some(n) = queue.pop_front() {
            if n == to {
                break;
            }
            for &(m, arc) in self.neighbours(n) {
                if !seen[m.0] {
                    seen[m.0] = true;
                    via[m.0] = Some(arc);
                    queue.push_back(m);
                }
            }
        }
        if !seen[to.0] {
            return None;
        }
        let mut arcs = Vec::new();
        let mut at = to;
        while let Some(arc) = via[at.0] {
            arcs.push(arc);
            at = self.arc_ends(arc).0;
        }
        arcs.reverse();
        Some(arcs)
    }

    /// `v(a, b)` of eq. 1: the capacity of the narrowest link on `L(a, b)`,
    /// the most `b` can receive from `a` with no other traffic; `None` if not
    /// connected, `u64::MAX` if `a == b`.
    pub fn path_bandwidth(&self, a: NodeId, b: NodeId) -> Option<u64> {
        self.path(a, b).map(|arcs| {
            arcs.iter()
                .map(|&e| self.arc_capacity(e))
                .min()
                .unwrap_or(u64::MAX)
        })
    }

    /// Checks a broadcast's source and destinations: all hosts, connected,
    /// no duplicates, the source not among the destinations.
    pub(crate) fn check_broadcast(
        &self,
        source: NodeId,
        destinations: &[NodeId],
    ) -> Result<(), CollectiveError> {
        self.check(source)?;
        if self.kind(source) != NodeKind::Host {
            return Err(CollectiveError::NotAHost(source));
        }
        let mut seen = vec![false; self.kinds.len()];
        seen[source.0] = true;
        for &d in destinations {
            self.check(d)?;
            if self.kind(d) != NodeKind::Host {
                return Err(CollectiveError::NotAHost(d));
            }
            if std::mem::replace(&mut seen[d.0], true) {
                return Err(CollectiveError::DuplicateDestination(d));
            }
        }
        let reach = self.reachable(source, |_| true);
        if let Some(&d) = destinations.iter().find(|d| !reach[d.0]) {
            return Err(CollectiveError::Unreachable(d));
        }
        Ok(())
    }

    /// Which nodes `from` reaches over arcs for which `usable` holds.
    pub(crate) fn reachable(&self, from: NodeId, usable: impl Fn(ArcId) -> bool) -> Vec<bool> {
        let mut seen = vec![false; self.kinds.len()];
        seen[from.0] = true;
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for &(m, arc) in self.neighbours(n) {
                if !seen[m.0] && usable(arc) {
                    seen[m.0] = true;
                    stack.push(m);
                }
            }
        }
        seen
    }

    /// The destinations that `source` reaches over usable arcs, in
    /// depth-first preorder (neighbours in link order): "tracing
    /// destinations in depth-first manner from s" (Algorithm 1).
    pub(crate) fn depth_first_destinations(
        &self,
        source: NodeId,
        is_destination: &[bool],
        usable: impl Fn(ArcId) -> bool,
    ) -> Vec<NodeId> {
        let mut order = Vec::new();
        let mut seen = vec![false; self.kinds.len()];
        seen[source.0] = true;
        // (node, index of the next neighbour to look at)
        let mut stack = vec![(source, 0usize)];
        while let Some(top) = stack.last_mut() {
            let (n, next) = *top;
            if let Some(&(m, arc)) = self.neighbours(n).get(next) {
                top.1 += 1;
                if !seen[m.0] && usable(arc) {
                    seen[m.0] = true;
                    if is_destination[m.0] {
                        order.push(m);
                    }
                    stack.push((m, 0));
                }
            } else {
                stack.pop();
            }
        }
        order
    }
}
