//! `bspweb cluster-sim`: DiDiC (the pure `clustering` crate) against MCL
//! on the graphs of dissertation §5.4, over time, with dynamics; writes a
//! report with the shape of Figs. 5.9–5.11 (the IO half: files, `mcl`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, bail};
use clap::Args;
use clustering::{
    Didic, DidicParams, Dynamics, Graph, GraphModel, Rng, Topology, VertexId, modularity, ncv,
    refine,
};
use sim::svg::{Series, line_plot};

#[derive(Args, Debug)]
pub struct ClusterSimArgs {
    /// Graph sizes (vertices), comma-separated
    #[arg(long, value_delimiter = ',', default_value = "800,1600,2400,3200")]
    sizes: Vec<usize>,
    /// Time steps per graph
    #[arg(long, default_value_t = 300)]
    steps: u32,
    /// Dense areas of the graph (§5.4's x)
    #[arg(long, default_value_t = 10)]
    areas: usize,
    /// Communication radius on the unit torus (§5.4's rad)
    #[arg(long, default_value_t = 0.33)]
    rad: f64,
    /// Nearest neighbours each vertex connects to (§5.4's maxNeigh)
    #[arg(long, default_value_t = 16)]
    max_neigh: usize,
    /// Percent of the vertices replaced by new ones at each dynamics step
    #[arg(long, default_value_t = 2.0)]
    dynamics: f64,
    /// Time steps between two dynamics steps (§5.4: 1 % every step, 2 %
    /// every second, 5 % every fifth)
    #[arg(long, default_value_t = 2)]
    dynamics_every: u32,
    /// Cluster systems (k)
    #[arg(long, default_value_t = 20)]
    k: u32,
    /// FOS/T iterations per time step (ψ)
    #[arg(long, default_value_t = 11)]
    psi: u32,
    /// FOS/B iterations per FOS/T iteration (ρ)
    #[arg(long, default_value_t = 11)]
    rho: u32,
    /// Benefit B of a vertex in its own cluster's system
    #[arg(long, default_value_t = 10.0)]
    benefit: f64,
    /// How FOS/T takes the secondary load: zero-sum (§5.3's prose: the load
    /// sent to a cluster is subtracted from the other vertices) or listing
    /// (Listing 5.1 as printed: added, so primary totals grow)
    #[arg(long, value_enum, default_value_t = DrainArg::ZeroSum)]
    drain: DrainArg,
    /// Run MCL on the current graph every this many time steps
    #[arg(long, default_value_t = 50)]
    mcl_every: u32,
    /// MCL's inflation (§5.4: 1.2)
    #[arg(long, default_value_t = 1.2)]
    inflation: f64,
    /// Seed of the graphs, the dynamics and DiDiC's random start
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Graphs per size (each from its own seed): the report gives the mean
    /// and standard deviation of each figure over them
    #[arg(long, default_value_t = 1)]
    repeats: u32,
    /// Folder for the report (README.md, results.csv, SVG figures)
    #[arg(long, default_value = "cluster-report")]
    out: PathBuf,
}

/// `--drain` ([`clustering::Drain`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DrainArg {
    ZeroSum,
    Listing,
}

impl DrainArg {
    fn drain(self) -> clustering::Drain {
        match self {
            DrainArg::ZeroSum => clustering::Drain::ZeroSum,
            DrainArg::Listing => clustering::Drain::Listing,
        }
    }

    fn name(self) -> &'static str {
        match self {
            DrainArg::ZeroSum => "zero-sum",
            DrainArg::Listing => "listing",
        }
    }
}

/// One time step's quality: `(time step, modularity, NCV, clusters)`.
type Quality = (u32, f64, f64, usize);

/// One graph's run: DiDiC's quality at every step (as Listing 5.1 leaves
/// it, and refined as the supernode uses it), MCL's at some.
struct Run {
    n: usize,
    repeat: u32,
    didic: Vec<Quality>,
    refined: Vec<Quality>,
    mcl: Vec<Quality>,
}

fn clusters(c: &BTreeMap<VertexId, u32>) -> usize {
    c.values().collect::<BTreeSet<_>>().len()
}

/// MCL's clustering of `graph` (`mcl --abc -I inflation`); vertices
/// without edges are clusters of their own.
fn mcl(graph: &Graph, inflation: f64, dir: &Path) -> anyhow::Result<BTreeMap<VertexId, u32>> {
    let input = dir.join("graph.abc");
    let output = dir.join("graph.mcl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&input)?);
    for (u, v, w) in graph.edges() {
        writeln!(f, "{u}\t{v}\t{w}")?;
    }
    f.flush()?;
    drop(f);
    let out = Command::new("mcl")
        .arg(&input)
        .args(["--abc", "-I", &inflation.to_string(), "-V", "all", "-o"])
        .arg(&output)
        .output()
        .context("cannot run `mcl`; install it with `sudo apt-get install mcl` (Debian's package of van Dongen's MCL)")?;
    if !out.status.success() {
        bail!(
            "mcl failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = std::fs::read_to_string(&output)?;
    let mut c = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        for v in line.split('\t').filter(|s| !s.is_empty()) {
            let v: VertexId = v
                .parse()
                .with_context(|| format!("mcl wrote an unknown vertex {v:?}"))?;
            c.insert(v, i as u32);
        }
    }
    let mut next = text.lines().count() as u32;
    for v in graph.vertices() {
        c.entry(v).or_insert_with(|| {
            next += 1;
            next
        });
    }
    Ok(c)
}

/// The seed of repeat `r` of size `n`: a size's first graph depends on
/// `seed` and `n` only, so `--sizes 3200` alone gives the graph of the full
/// run, and the first repeat is the graph of a run without `--repeats`.
fn graph_seed(seed: u64, n: usize, r: u32) -> u64 {
    seed ^ (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ u64::from(r).wrapping_mul(0xD1B5_4A32_D192_ED03)
}

fn run_one(a: &ClusterSimArgs, n: usize, repeat: u32, dir: &Path) -> anyhow::Result<Run> {
    let seed = graph_seed(a.seed, n, repeat);
    let mut rng = Rng::new(seed);
    let mut topology = Topology::generate(
        GraphModel::Areas { n, x: a.areas },
        a.rad,
        a.max_neigh,
        &mut rng,
    );
    let mut didic = Didic::new(DidicParams {
        k: a.k,
        psi: a.psi,
        rho: a.rho,
        benefit: a.benefit,
        drain: a.drain.drain(),
        ..DidicParams::default()
    });
    let dynamics = Dynamics {
        fraction: a.dynamics / 100.0,
        every: a.dynamics_every,
    };
    let mut run = Run {
        n,
        repeat,
        didic: vec![],
        refined: vec![],
        mcl: vec![],
    };
    for t in 1..=a.steps {
        didic.step(topology.graph(), &mut rng);
        let c = didic.clustering();
        let g = topology.graph();
        run.didic
            .push((t, modularity(g, &c), ncv(g, &c), clusters(&c)));
        let r = refine(g, &c, a.k);
        run.refined
            .push((t, modularity(g, &r), ncv(g, &r), clusters(&r)));
        if a.mcl_every > 0 && (t % a.mcl_every == 0 || t == a.steps) {
            let m = mcl(g, a.inflation, dir)?;
            run.mcl
                .push((t, modularity(g, &m), ncv(g, &m), clusters(&m)));
        }
        if t % 25 == 0 || t == a.steps {
            let (_, m, v, k) = run.didic[run.didic.len() - 1];
            let (_, rm, _, rk) = run.refined[run.refined.len() - 1];
            eprintln!(
                "  n = {n}, graph {}: time step {t}/{}: DiDiC modularity {m:.4}, NCV {v:.4}, {k} clusters; refined {rm:.4}, {rk} clusters",
                repeat + 1,
                a.steps
            );
        }
        if t < a.steps {
            dynamics.apply(t, &mut topology, &mut didic, &mut rng);
        }
    }
    Ok(run)
}

/// `x` as "mean ± sd" over several graphs, or the value of one, with
/// `decimals` (4 for qualities; counts get 0 for one graph, 1 for several),
/// the mean's sign always shown when `signed`.
fn spread(x: &[f64], decimals: usize, signed: bool) -> String {
    let (mean, sd) = mean_sd(x);
    let mean = if signed {
        format!("{mean:+.decimals$}")
    } else {
        format!("{mean:.decimals$}")
    };
    if x.len() == 1 {
        mean
    } else {
        format!("{mean} ± {sd:.decimals$}")
    }
}

fn summary(x: &[f64]) -> String {
    spread(x, 4, false)
}

fn signed_summary(x: &[f64]) -> String {
    spread(x, 4, true)
}

fn count_summary(x: &[f64]) -> String {
    spread(x, if x.len() == 1 { 0 } else { 1 }, false)
}

/// The mean and the sample standard deviation (0 for one value).
fn mean_sd(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = if x.len() > 1 {
        x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// DiDiC's mean modularity (in `series`, one entry per time step) and
/// MCL's at MCL's time steps in the second half of the run ("once
/// stable").
fn stable(run: &Run, series: &[Quality], steps: u32) -> Option<(f64, f64, usize)> {
    let late: Vec<&Quality> = run.mcl.iter().filter(|m| m.0 > steps / 2).collect();
    if late.is_empty() {
        return None;
    }
    let didic: f64 =
        late.iter().map(|m| series[m.0 as usize - 1].1).sum::<f64>() / late.len() as f64;
    let mcl: f64 = late.iter().map(|m| m.1).sum::<f64>() / late.len() as f64;
    Some((didic, mcl, late.len()))
}

pub fn run(a: ClusterSimArgs) -> anyhow::Result<ExitCode> {
    if a.sizes.is_empty() || a.sizes.iter().any(|&n| n < 10) {
        bail!("--sizes: give graph sizes of at least 10 vertices");
    }
    if a.steps == 0 || a.k == 0 || a.psi == 0 || a.rho == 0 {
        bail!("--steps, --k, --psi and --rho must be at least 1");
    }
    if !(a.benefit >= 1.0 && a.benefit.is_finite()) {
        bail!("--benefit must be at least 1 (B ≫ 1 in the dissertation)");
    }
    if !(0.0..=50.0).contains(&a.dynamics) {
        bail!("--dynamics is a percentage of the vertices, 0 to 50");
    }
    if !(a.inflation > 1.0 && a.inflation.is_finite()) {
        bail!("--inflation must be above 1 (MCL's inflation; §5.4 used 1.2)");
    }
    if !(a.rad > 0.0 && a.rad <= 0.5) {
        bail!("--rad must be in (0, 0.5] (the unit torus)");
    }
    if a.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("cannot create {}", a.out.display()))?;
    let scratch = tempfile::tempdir().context("cannot create a temporary directory")?;
    let mut runs = vec![];
    let total = a.sizes.len() * a.repeats as usize;
    for &n in &a.sizes {
        for r in 0..a.repeats {
            eprintln!("graph {} of {total}: {n} vertices", runs.len() + 1);
            runs.push(run_one(&a, n, r, scratch.path())?);
        }
    }

    let mut csv = String::from("vertices,graph,time_step,algorithm,modularity,ncv,clusters\n");
    for r in &runs {
        for (t, m, v, k) in &r.didic {
            let _ = writeln!(csv, "{},{},{t},didic,{m},{v},{k}", r.n, r.repeat + 1);
        }
        for (t, m, v, k) in &r.refined {
            let _ = writeln!(
                csv,
                "{},{},{t},didic-refined,{m},{v},{k}",
                r.n,
                r.repeat + 1
            );
        }
        for (t, m, v, k) in &r.mcl {
            let _ = writeln!(csv, "{},{},{t},mcl,{m},{v},{k}", r.n, r.repeat + 1);
        }
    }
    std::fs::write(a.out.join("results.csv"), csv)?;

    let mut md = String::new();
    let _ = writeln!(
        md,
        "# DiDiC against MCL (dissertation §5.4, Figs. 5.9–5.11)\n"
    );
    let _ = writeln!(
        md,
        "`bspweb cluster-sim --sizes {} --steps {} --areas {} --rad {} --max-neigh {} --dynamics {} --dynamics-every {} --k {} --psi {} --rho {} --benefit {} --drain {} --mcl-every {} --inflation {} --seed {} --repeats {}`\n",
        a.sizes
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(","),
        a.steps,
        a.areas,
        a.rad,
        a.max_neigh,
        a.dynamics,
        a.dynamics_every,
        a.k,
        a.psi,
        a.rho,
        a.benefit,
        a.drain.name(),
        a.mcl_every,
        a.inflation,
        a.seed,
        a.repeats
    );
    let _ = writeln!(
        md,
        "Graphs of §5.4's PUB-Web class ({} dense areas, home computers, edges to the {} nearest within {}, bandwidth = 1 / distance); {} % of the vertices replaced every {} time steps. MCL (`mcl --abc -I {}`) runs on the same graph every {} time steps and at the last. \"Once stable\" averages the MCL time steps of the second half of a run. {}\n",
        a.areas,
        a.max_neigh,
        a.rad,
        a.dynamics,
        a.dynamics_every,
        a.inflation,
        a.mcl_every,
        if a.repeats == 1 {
            "One graph per size: differences of a few hundredths can be noise (`--repeats` runs several).".to_string()
        } else {
            format!(
                "{} graphs per size, each from its own seed: figures are mean ± standard deviation over them; \"within 0.01\" counts the graphs on which DiDiC's modularity once stable is at most 0.01 below MCL's.",
                a.repeats
            )
        }
    );
    let _ = writeln!(md, "## DiDiC as Listing 5.1 leaves it\n");
    table(&mut md, &a, &runs, |r| &r.didic);
    let _ = writeln!(
        md,
        "## DiDiC as the supernode uses it\n\nEach DiDiC cluster split into its connected parts, then clusters merged while a merge raises the modularity (`clustering::refine`; `MeasuredNetwork::clusters` does the same from time step 30).\n"
    );
    table(&mut md, &a, &runs, |r| &r.refined);
    let _ = writeln!(md);
    for r in runs.iter().filter(|r| r.repeat == 0) {
        let series = |pick: fn(&(u32, f64, f64, usize)) -> f64, label: &str| {
            vec![
                Series {
                    label: format!("DiDiC {label}"),
                    points: r.didic.iter().map(|p| (f64::from(p.0), pick(p))).collect(),
                },
                Series {
                    label: format!("MCL {label}"),
                    points: r.mcl.iter().map(|p| (f64::from(p.0), pick(p))).collect(),
                },
            ]
        };
        let mut all = series(|p| p.1, "modularity");
        all.push(Series {
            label: "DiDiC refined modularity".to_string(),
            points: r.refined.iter().map(|p| (f64::from(p.0), p.1)).collect(),
        });
        all.extend(series(|p| p.2, "NCV"));
        let svg = line_plot(
            &format!("{} vertices (graph 1): modularity and NCV over time", r.n),
            "time step",
            "modularity, NCV",
            &all,
        );
        let name = format!("quality-{}.svg", r.n);
        std::fs::write(a.out.join(&name), svg)?;
        let _ = writeln!(md, "![{} vertices]({name})\n", r.n);
    }
    std::fs::write(a.out.join("README.md"), md)?;
    eprintln!(
        "wrote {} (README.md, results.csv, quality-N.svg)",
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// The comparison table of one DiDiC series (`pick`) against MCL.
fn table(md: &mut String, a: &ClusterSimArgs, runs: &[Run], pick: fn(&Run) -> &[Quality]) {
    let _ = writeln!(
        md,
        "| vertices | DiDiC modularity, once stable | MCL modularity | DiDiC − MCL | within 0.01 | DiDiC NCV at the end | clusters at the end (DiDiC / MCL) |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|");
    for &n in &a.sizes {
        let of_size: Vec<&Run> = runs.iter().filter(|r| r.n == n).collect();
        let stables: Vec<(f64, f64)> = of_size
            .iter()
            .filter_map(|r| stable(r, pick(r), a.steps).map(|(d, m, _)| (d, m)))
            .collect();
        let lasts: Vec<&Quality> = of_size
            .iter()
            .map(|r| pick(r).last().expect("at least one step"))
            .collect();
        let ncv = summary(&lasts.iter().map(|l| l.2).collect::<Vec<_>>());
        let didic_k = count_summary(&lasts.iter().map(|l| l.3 as f64).collect::<Vec<_>>());
        let mcl_k: Vec<f64> = of_size
            .iter()
            .filter_map(|r| r.mcl.last().map(|m| m.3 as f64))
            .collect();
        let mcl_k = if mcl_k.is_empty() {
            "–".to_string()
        } else {
            count_summary(&mcl_k)
        };
        if stables.is_empty() {
            let last = summary(&lasts.iter().map(|l| l.1).collect::<Vec<_>>());
            let _ = writeln!(
                md,
                "| {n} | {last} (last) | – | – | – | {ncv} | {didic_k} / {mcl_k} |"
            );
            continue;
        }
        let d = summary(&stables.iter().map(|s| s.0).collect::<Vec<_>>());
        let m = summary(&stables.iter().map(|s| s.1).collect::<Vec<_>>());
        let diffs: Vec<f64> = stables.iter().map(|s| s.0 - s.1).collect();
        let within = diffs.iter().filter(|&&x| x >= -0.01).count();
        let _ = writeln!(
            md,
            "| {n} | {d} | {m} | {} | {within} of {} | {ncv} | {didic_k} / {mcl_k} |",
            signed_summary(&diffs),
            diffs.len()
        );
    }
}
