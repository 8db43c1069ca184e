//! Reference numbers from the dissertation, printed beside ours in reports.

use crate::jobs::JobProfile;

/// One row of Tables 4.8 / 4.9: (profile, balancer slug, process stretch,
/// job stretch). The dissertation has no rendezvous row.
pub type StretchRow = (JobProfile, &'static str, f64, f64);

use JobProfile::{Hpc2n, LlnlAtlas, LlnlThunder, SdscBlue, SdscDataStar};

/// Table 4.8: type B, ideal load (overload factor 1).
pub const TABLE_4_8: [StretchRow; 35] = [
    (Hpc2n, "rr", 1.157, 3.100),
    (Hpc2n, "rd", 0.469, 0.684),
    (Hpc2n, "dr", 0.834, 2.168),
    (Hpc2n, "dd", 0.351, 0.502),
    (Hpc2n, "multi", 0.574, 1.003),
    (Hpc2n, "ws-head", 0.313, 0.407),
    (Hpc2n, "ws-tail", 0.313, 0.405),
    (LlnlAtlas, "rr", 3.203, 11.823),
    (LlnlAtlas, "rd", 2.293, 3.373),
    (LlnlAtlas, "dr", 2.348, 13.305),
    (LlnlAtlas, "dd", 1.726, 2.368),
    (LlnlAtlas, "multi", 1.796, 3.682),
    (LlnlAtlas, "ws-head", 1.055, 1.126),
    (LlnlAtlas, "ws-tail", 1.056, 1.120),
    (LlnlThunder, "rr", 2.381, 6.284),
    (LlnlThunder, "rd", 1.700, 1.591),
    (LlnlThunder, "dr", 1.765, 5.435),
    (LlnlThunder, "dd", 1.329, 1.109),
    (LlnlThunder, "multi", 1.438, 1.920),
    (LlnlThunder, "ws-head", 0.808, 0.604),
    (LlnlThunder, "ws-tail", 0.808, 0.608),
    (SdscBlue, "rr", 1.687, 8.035),
    (SdscBlue, "rd", 0.919, 1.619),
    (SdscBlue, "dr", 1.202, 6.419),
    (SdscBlue, "dd", 0.673, 1.167),
    (SdscBlue, "multi", 0.864, 2.273),
    (SdscBlue, "ws-head", 0.512, 0.699),
    (SdscBlue, "ws-tail", 0.512, 0.700),
    (SdscDataStar, "rr", 2.137, 8.981),
    (SdscDataStar, "rd", 1.497, 1.953),
    (SdscDataStar, "dr", 1.584, 6.939),
    (SdscDataStar, "dd", 1.088, 1.396),
    (SdscDataStar, "multi", 1.197, 2.458),
    (SdscDataStar, "ws-head", 0.713, 0.773),
    (SdscDataStar, "ws-tail", 0.713, 0.773),
];

/// Table 4.9: type B, overload factor 4.
pub const TABLE_4_9: [StretchRow; 35] = [
    (Hpc2n, "rr", 4.220, 14.834),
    (Hpc2n, "rd", 1.273, 1.964),
    (Hpc2n, "dr", 2.759, 10.703),
    (Hpc2n, "dd", 1.102, 1.454),
    (Hpc2n, "multi", 1.369, 2.657),
    (Hpc2n, "ws-head", 1.717, 4.737),
    (Hpc2n, "ws-tail", 1.676, 5.760),
    (LlnlAtlas, "rr", 6.119, 46.178),
    (LlnlAtlas, "rd", 2.959, 6.272),
    (LlnlAtlas, "dr", 4.120, 56.115),
    (LlnlAtlas, "dd", 2.359, 4.264),
    (LlnlAtlas, "multi", 2.469, 7.757),
    (LlnlAtlas, "ws-head", 2.469, 21.393),
    (LlnlAtlas, "ws-tail", 2.266, 44.587),
    (LlnlThunder, "rr", 5.425, 30.816),
    (LlnlThunder, "rd", 2.496, 3.668),
    (LlnlThunder, "dr", 3.664, 26.385),
    (LlnlThunder, "dd", 1.957, 2.530),
    (LlnlThunder, "multi", 2.127, 4.640),
    (LlnlThunder, "ws-head", 2.149, 11.382),
    (LlnlThunder, "ws-tail", 2.042, 16.123),
    (SdscBlue, "rr", 4.729, 38.136),
    (SdscBlue, "rd", 1.662, 3.926),
    (SdscBlue, "dr", 3.063, 31.851),
    (SdscBlue, "dd", 1.366, 2.633),
    (SdscBlue, "multi", 1.626, 5.704),
    (SdscBlue, "ws-head", 1.870, 14.464),
    (SdscBlue, "ws-tail", 1.802, 21.098),
    (SdscDataStar, "rr", 5.193, 43.326),
    (SdscDataStar, "rd", 2.190, 4.668),
    (SdscDataStar, "dr", 3.481, 37.111),
    (SdscDataStar, "dd", 1.759, 3.156),
    (SdscDataStar, "multi", 1.956, 6.039),
    (SdscDataStar, "ws-head", 1.995, 15.309),
    (SdscDataStar, "ws-tail", 1.889, 22.900),
];

/// The dissertation's (process, job) stretch factors for a type-B run, if
/// it has that row: overload 1 → Table 4.8, overload 4 → Table 4.9.
pub fn type_b_stretch(
    profile: JobProfile,
    overload: f64,
    balancer_slug: &str,
) -> Option<(f64, f64)> {
    let table: &[StretchRow] = if overload == 1.0 {
        &TABLE_4_8
    } else if overload == 4.0 {
        &TABLE_4_9
    } else {
        return None;
    };
    table
        .iter()
        .find(|(p, b, _, _)| *p == profile && *b == balancer_slug)
        .map(|&(_, _, procs, jobs)| (procs, jobs))
}
