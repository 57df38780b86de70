//! Measures how many clients maglev remaps when one of N endpoints goes
//! (over every slot of the plan: client addresses hash into slots
//! uniformly), for the built-in table sizes: `cargo run -p kpx-sched
//! --example remap --release`.
use kpx_sched::{Dest, Plan};

fn main() {
    for size in [251u32, 509, 1021] {
        let (mut worst, mut sum, mut runs) = (0.0f64, 0.0, 0);
        for base in 1..40u8 {
            for n in [3usize, 4, 5, 8] {
                let d: Vec<Dest> =
                    (0..n).map(|i| Dest::new(std::net::IpAddr::from([10, base, i as u8, 5]), 8080, 1)).collect();
                for gone in 0..n {
                    let p = [("table-size".to_string(), size.to_string())];
                    let Plan::Slots(a) = kpx_sched::plan::plan("maglev", &p, &d).unwrap() else { unreachable!() };
                    let less: Vec<Dest> =
                        d.iter().enumerate().filter(|(i, _)| *i != gone).map(|(_, x)| x.clone()).collect();
                    let Plan::Slots(b) = kpx_sched::plan::plan("maglev", &p, &less).unwrap() else { unreachable!() };
                    let moved = a
                        .slots
                        .iter()
                        .zip(&b.slots)
                        .filter(|(x, y)| d[**x as usize].ip != less[**y as usize].ip)
                        .count();
                    let excess = moved as f64 / a.slots.len() as f64 - 1.0 / n as f64;
                    worst = worst.max(excess);
                    sum += excess;
                    runs += 1;
                }
            }
        }
        println!(
            "table-size {size}: remapped beyond 1/N over {runs} removals: worst {:.2} points, mean {:.2}",
            worst * 100.0,
            sum / f64::from(runs) * 100.0
        );
    }
}
