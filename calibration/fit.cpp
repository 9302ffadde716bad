#include "calibration/fit.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include <fmt/format.h>

namespace zp::calibration {

namespace {

std::string class_key(const Observation& o) {
  auto it = o.tags.find("source");
  std::string k = it == o.tags.end() ? std::string() : it->second;
  switch (o.kind) {
    case ObsKind::collective: return k + " collective";
    case ObsKind::kernel: return k + " " + kernel_class_name(o.kernel.cls);
    case ObsKind::phase: return k + " phase " + quantity_name(o.phase.quantity);
  }
  return k;
}


// Internal coordinates: log(value) for scale-like parameters, value / typical for the others.
struct Coords {
  std::vector<const ParamDef*> defs;
  double to_u(std::size_t j, double v) const {
    const ParamDef& d = *defs[j];
    return d.log_scale ? std::log(std::max(v, d.lo)) : v / d.typical;
  }
  double from_u(std::size_t j, double u) const {
    const ParamDef& d = *defs[j];
    return d.log_scale ? std::exp(u) : u * d.typical;
  }
  double lo(std::size_t j) const { return to_u(j, defs[j]->lo); }
  double hi(std::size_t j) const { return to_u(j, defs[j]->hi); }
  std::size_t size() const { return defs.size(); }
};

class Problem {
 public:
  Problem(const PredictFn& predict, const std::vector<Observation>& obs, const ModelParams& base, const FitOptions& opt)
      : predict_(predict), obs_(obs), base_(base) {
    want_.assign(obs.size(), 0);
    for (std::size_t i = 0; i < obs.size(); ++i)
      if (obs[i].fit) {
        want_[i] = 1;
        idx_.push_back(i);
        const double s = obs[i].spread;
        w_.push_back(obs[i].weight / std::sqrt(s * s + opt.model_floor * opt.model_floor));
        // Observations of one source and kind share a noise level (a class).
        const std::string key = class_key(obs[i]);
        auto it = std::find(class_names_.begin(), class_names_.end(), key);
        if (it == class_names_.end()) {
          class_names_.push_back(key);
          it = class_names_.end() - 1;
        }
        class_of_.push_back(static_cast<int>(it - class_names_.begin()));
      }
    threads_ = opt.threads > 0 ? opt.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    class_scale_.assign(class_names_.size(), 1.0);
  }
  // The loss: least squares (0) or Cauchy of this scale.
  void set_robust(double c) const { c_ = c; }

  std::size_t n() const { return idx_.size(); }

  ModelParams params(const Coords& c, const Eigen::VectorXd& u) const {
    ModelParams m = base_;
    for (std::size_t j = 0; j < c.size(); ++j) c.defs[j]->set(m, c.from_u(j, u[static_cast<Eigen::Index>(j)]));
    return m;
  }

  // Log ratios of the fitted observations, unweighted and weighted.
  Eigen::VectorXd log_ratios(const ModelParams& m) const {
    std::vector<double> out(obs_.size(), 0.0);
    predict_(m, want_, out);
    ++evaluations_;
    Eigen::VectorXd r(static_cast<Eigen::Index>(idx_.size()));
    for (std::size_t k = 0; k < idx_.size(); ++k) r[static_cast<Eigen::Index>(k)] = log_ratio(out[idx_[k]], obs_[idx_[k]]);
    return r;
  }
  // sign(r) sqrt(ρ(r)) with ρ the Cauchy loss c² log(1 + r²/c²), weighted: least squares on
  // these minimises Σ w² ρ.
  Eigen::VectorXd residuals(const ModelParams& m) const { return residuals_of(log_ratios(m)); }
  // The same, from log ratios already predicted.
  Eigen::VectorXd residuals_of(Eigen::VectorXd r) const {
    for (std::size_t k = 0; k < idx_.size(); ++k) {
      double& x = r[static_cast<Eigen::Index>(k)];
      if (c_ > 0) x = (x < 0 ? -1.0 : 1.0) * c_ * std::sqrt(std::log1p(x * x / (c_ * c_)));
      x *= w_[k] * class_scale_[static_cast<std::size_t>(class_of_[k])];
    }
    return r;
  }
  Eigen::VectorXd residuals(const Coords& c, const Eigen::VectorXd& u) const { return residuals(params(c, u)); }

  // Forward differences, columns on threads.
  Eigen::MatrixXd jacobian(const Coords& c, const Eigen::VectorXd& u, const Eigen::VectorXd& r0) const {
    const auto p = static_cast<Eigen::Index>(c.size());
    Eigen::MatrixXd J(r0.size(), p);
    auto column = [&](Eigen::Index j) {
      Eigen::VectorXd v = u;
      double h = 1e-4 * std::max(1.0, std::abs(u[j]));
      if (v[j] + h > c.hi(static_cast<std::size_t>(j))) h = -h;  // step inside the bounds
      v[j] += h;
      J.col(j) = (residuals(c, v) - r0) / h;
    };
    const int t = std::min<int>(threads_, static_cast<int>(p));
    if (t <= 1) {
      for (Eigen::Index j = 0; j < p; ++j) column(j);
      return J;
    }
    std::vector<std::thread> pool;
    std::atomic<Eigen::Index> next{0};
    for (int k = 0; k < t; ++k)
      pool.emplace_back([&]() {
        for (Eigen::Index j = next++; j < p; j = next++) column(j);
      });
    for (auto& th : pool) th.join();
    return J;
  }

  int evaluations() const { return evaluations_.load(); }
  const ModelParams& base() const { return base_; }

  // While alive, parameters not being fitted sit at the point (c, u) instead of the start.
  class Fixed {
   public:
    Fixed(const Problem& pb, const Coords& c, const Eigen::VectorXd& u) : pb_(pb), saved_(pb.base_) {
      pb.base_ = pb.params(c, u);
    }
    ~Fixed() { pb_.base_ = saved_; }
    Fixed(const Fixed&) = delete;
    Fixed& operator=(const Fixed&) = delete;

   private:
    const Problem& pb_;
    ModelParams saved_;
  };

 private:
  const PredictFn& predict_;
  const std::vector<Observation>& obs_;
  mutable ModelParams base_;
  std::vector<char> want_;
  std::vector<std::size_t> idx_;
  std::vector<double> w_;
  std::vector<std::string> class_names_;
  std::vector<int> class_of_;
  mutable std::vector<double> class_scale_;

 public:
  // Rescales each class of three or more observations so its weighted residuals have a root
  // mean square of 1 at `r` (residuals under the current weights): a class the model fits
  // worse counts less, and the covariance reflects each class's own scatter.
  void reweight(const Eigen::VectorXd& r) const {
    std::vector<double> ss(class_scale_.size(), 0.0);
    std::vector<int> n(class_scale_.size(), 0);
    for (std::size_t k = 0; k < idx_.size(); ++k) {
      const auto c = static_cast<std::size_t>(class_of_[k]);
      ss[c] += r[static_cast<Eigen::Index>(k)] * r[static_cast<Eigen::Index>(k)];
      ++n[c];
    }
    for (std::size_t c = 0; c < ss.size(); ++c)
      if (n[c] >= 3 && ss[c] > 0) class_scale_[c] /= std::max(std::sqrt(ss[c] / n[c]), 1.0);
  }
  void reset_weights() const { std::fill(class_scale_.begin(), class_scale_.end(), 1.0); }

 private:
  int threads_ = 1;
  mutable double c_ = 0;
  mutable std::atomic<int> evaluations_{0};
};

struct LmResult {
  Eigen::VectorXd u;
  Eigen::VectorXd r;
  int iterations = 0;
  bool converged = false;
};

LmResult levenberg_marquardt(const Problem& pb, const Coords& c, Eigen::VectorXd u, int max_iter) {
  const auto p = static_cast<Eigen::Index>(c.size());
  for (Eigen::Index j = 0; j < p; ++j) u[j] = std::clamp(u[j], c.lo(static_cast<std::size_t>(j)), c.hi(static_cast<std::size_t>(j)));
  LmResult out;
  Eigen::VectorXd r = pb.residuals(c, u);
  double cost = 0.5 * r.squaredNorm();
  double lambda = 1e-3;
  for (int it = 0; it < max_iter; ++it) {
    out.iterations = it + 1;
    const Eigen::MatrixXd J = pb.jacobian(c, u, r);
    const Eigen::VectorXd g = J.transpose() * r;
    // Parameters at a bound that the gradient pushes outward stay there this iteration.
    std::vector<Eigen::Index> free;
    for (Eigen::Index j = 0; j < p; ++j) {
      const auto js = static_cast<std::size_t>(j);
      const bool at_lo = u[j] <= c.lo(js) + 1e-12 && g[j] > 0;
      const bool at_hi = u[j] >= c.hi(js) - 1e-12 && g[j] < 0;
      if (!at_lo && !at_hi) free.push_back(j);
    }
    if (free.empty()) {
      out.converged = true;
      break;
    }
    const auto f = static_cast<Eigen::Index>(free.size());
    Eigen::MatrixXd Jf(J.rows(), f);
    Eigen::VectorXd gf(f);
    for (Eigen::Index k = 0; k < f; ++k) {
      Jf.col(k) = J.col(free[static_cast<std::size_t>(k)]);
      gf[k] = g[free[static_cast<std::size_t>(k)]];
    }
    const Eigen::MatrixXd A = Jf.transpose() * Jf;
    bool improved = false;
    double gain = 0;
    while (lambda < 1e12) {
      Eigen::MatrixXd M = A;
      for (Eigen::Index k = 0; k < f; ++k) M(k, k) += lambda * std::max(A(k, k), 1e-12);
      const Eigen::VectorXd step = M.ldlt().solve(-gf);
      Eigen::VectorXd un = u;
      for (Eigen::Index k = 0; k < f; ++k) {
        const Eigen::Index j = free[static_cast<std::size_t>(k)];
        un[j] = std::clamp(u[j] + step[k], c.lo(static_cast<std::size_t>(j)), c.hi(static_cast<std::size_t>(j)));
      }
      if ((un - u).norm() < 1e-12) break;
      const Eigen::VectorXd rn = pb.residuals(c, un);
      const double cn = 0.5 * rn.squaredNorm();
      if (std::isfinite(cn) && cn < cost) {
        gain = (cost - cn) / std::max(cost, 1e-300);
        u = un;
        r = rn;
        cost = cn;
        lambda = std::max(lambda / 3, 1e-9);
        improved = true;
        break;
      }
      lambda *= 4;
    }
    if (!improved || gain < 1e-10) {
      out.converged = true;
      break;
    }
  }
  out.u = u;
  out.r = r;
  return out;
}

std::string fmt_value(const ParamDef& d, double v) {
  return d.unit.empty() ? fmt::format("{:.4g}", v) : fmt::format("{:.4g} {}", v, d.unit);
}

}  // namespace

double log_ratio(double predicted, const Observation& o) {
  const double f = o.floor.v;
  const double p = std::max(predicted, 0.0) + f, m = o.measured.v + f;
  if (!(p > 0)) return std::log(1e-12 / m);  // predicted nothing where something was measured
  return std::log(p / m);
}

FitResult fit(const PredictFn& predict, const std::vector<Observation>& obs, const ModelParams& start,
              const FitOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  FitResult res;
  res.before = start;
  const Problem pb(predict, obs, start, opt);
  res.n_fit = static_cast<int>(pb.n());

  // Screen: a parameter that no fitted observation depends on, or that the data cannot tell
  // apart from the parameters accepted before it, is refused with the reason.
  std::vector<const ParamDef*> accepted;
  // Parameters the screen moved off a plateau (below), to start the fit from.
  std::vector<std::pair<const ParamDef*, double>> moves;
  auto screen = [&](const ModelParams& at_in, const std::vector<const ParamDef*>& candidates) {
    ModelParams at = at_in;
    std::vector<Refusal> refusals;
    if (pb.n() == 0) {
      for (const ParamDef* d : candidates) refusals.push_back({d->name, "no observation is fitted"});
      return refusals;
    }
    Eigen::VectorXd r0 = pb.log_ratios(at);
    double cost0 = pb.residuals_of(r0).squaredNorm();  // the screen runs least squares (set_robust(0))
    std::vector<const ParamDef*> sensitive;
    for (const ParamDef* d : candidates) {
      // Doubling and halving (log parameters), or moving by its size (linear ones).
      double worst = 0;
      const double v = d->get(at);
      double best_cost = cost0, best_v = v;
      for (int sgn : {+1, -1}) {
        double nv = d->log_scale ? v * (sgn > 0 ? 2.0 : 0.5) : v + sgn * std::max(std::abs(v), d->typical);
        nv = std::clamp(nv, d->lo, d->hi);
        if (nv == v) continue;
        ModelParams m = at;
        d->set(m, nv);
        const Eigen::VectorXd r = pb.log_ratios(m);
        for (Eigen::Index k = 0; k < r.size(); ++k) worst = std::max(worst, std::abs(r[k] - r0[k]));
        const double cost = pb.residuals_of(r).squaredNorm();
        if (cost < best_cost) {
          best_cost = cost;
          best_v = nv;
        }
      }
      // On a plateau (a kernel priced by max(FLOP time, byte time) sits on its byte side at
      // the start, so a small step moves nothing) the local derivative is zero although a
      // factor of two moves the prediction: start from the better of the two instead.
      if (worst >= opt.insensitive && best_v != v) {
        ModelParams m = at;
        d->set(m, v * (1 + 1e-4) + 1e-12);
        const Eigen::VectorXd r = pb.log_ratios(m);
        if ((r - r0).cwiseAbs().maxCoeff() < 1e-9) {
          d->set(at, best_v);
          moves.emplace_back(d, best_v);
          r0 = pb.log_ratios(at);
          cost0 = pb.residuals_of(r0).squaredNorm();
        }
      }
      if (worst < opt.insensitive) {
        refusals.push_back({d->name, fmt::format("no fitted observation depends on it (doubling or halving it changes "
                                                 "no prediction by {:g}%); {} would determine it",
                                                 100 * opt.insensitive, d->determined_by)});
        continue;
      }
      sensitive.push_back(d);
    }
    if (sensitive.empty()) return refusals;
    // Collinearity: normalised Jacobian columns, accepted greedily in priority order.
    std::vector<const ParamDef*> all = accepted;
    all.insert(all.end(), sensitive.begin(), sensitive.end());
    Coords c{all};
    Eigen::VectorXd u(static_cast<Eigen::Index>(c.size()));
    for (std::size_t j = 0; j < c.size(); ++j) u[static_cast<Eigen::Index>(j)] = c.to_u(j, all[j]->get(at));
    const Eigen::MatrixXd J = pb.jacobian(c, u, pb.residuals(c, u));
    // A column this small moves no prediction measurably (below 1e-9 of a log unit on average).
    const double tiny = 1e-9 * std::sqrt(static_cast<double>(J.rows()));
    Eigen::MatrixXd Jn = J;
    for (Eigen::Index j = 0; j < Jn.cols(); ++j) {
      const double nrm = Jn.col(j).norm();
      if (nrm > tiny) Jn.col(j) /= nrm;
      else Jn.col(j).setZero();
    }
    const Eigen::MatrixXd G = Jn.transpose() * Jn;
    std::vector<Eigen::Index> keep;
    const std::size_t base = accepted.size();  // `all` is accepted-before-this-screen, then `sensitive`
    for (std::size_t j = 0; j < base; ++j) keep.push_back(static_cast<Eigen::Index>(j));
    for (std::size_t s = 0; s < sensitive.size(); ++s) {
      const auto j = static_cast<Eigen::Index>(base + s);
      if (J.col(j).norm() <= tiny) {
        refusals.push_back({sensitive[s]->name, fmt::format("no fitted observation depends on it here; {} would determine it",
                                                            sensitive[s]->determined_by)});
        continue;
      }
      std::vector<Eigen::Index> trial = keep;
      trial.push_back(j);
      const auto k = static_cast<Eigen::Index>(trial.size());
      Eigen::MatrixXd Gs(k, k);
      for (Eigen::Index a = 0; a < k; ++a)
        for (Eigen::Index b = 0; b < k; ++b) Gs(a, b) = G(trial[static_cast<std::size_t>(a)], trial[static_cast<std::size_t>(b)]);
      const double lmin = Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd>(Gs, Eigen::EigenvaluesOnly).eigenvalues()[0];
      if (std::sqrt(std::max(lmin, 0.0)) >= opt.collinearity) {
        keep.push_back(j);
        accepted.push_back(sensitive[s]);
        continue;
      }
      // Name the accepted parameter it moves most like.
      std::string with;
      double best = -1;
      for (std::size_t a = 0; a + 1 < trial.size(); ++a) {
        const double cr = std::abs(G(j, trial[a]));
        if (cr > best) {
          best = cr;
          with = all[static_cast<std::size_t>(trial[a])]->name;
        }
      }
      refusals.push_back({sensitive[s]->name,
                          with.empty() ? fmt::format("the data cannot determine it; {} would", sensitive[s]->determined_by)
                                       : fmt::format("the data cannot tell it from {} (their effects correlate at {:.3f}); {} "
                                                     "would separate them",
                                                     with, best, sensitive[s]->determined_by)});
    }
    return refusals;
  };

  pb.set_robust(0);
  std::vector<Refusal> refused = screen(start, opt.candidates);
  ModelParams current = start;
  for (const auto& [d, v] : moves) d->set(current, v);
  moves.clear();
  std::vector<const ParamDef*> dropped_poor;
  LmResult lm;
  Coords c;
  bool retried = false;
  for (int round = 0; round < static_cast<int>(opt.candidates.size()) + 2; ++round) {
    c = Coords{accepted};
    pb.reset_weights();
    Eigen::VectorXd u(static_cast<Eigen::Index>(c.size()));
    for (std::size_t j = 0; j < c.size(); ++j) u[static_cast<Eigen::Index>(j)] = c.to_u(j, accepted[j]->get(current));
    if (c.size() == 0) {
      lm = LmResult{u, pb.residuals(start), 0, true};
      current = start;
      res.fitted.clear();
      res.dof = static_cast<int>(pb.n());
      res.sigma = pb.n() > 0 ? std::sqrt(lm.r.squaredNorm() / static_cast<double>(pb.n())) : 0;
      break;
    }
    // Least squares from the start (far from the truth the Cauchy loss is nearly flat), coarse
    // to fine: the scale parameters first, then latencies and curve shapes, each stage from
    // the last one's point; then the robust loss from there.
    pb.set_robust(0);
    LmResult ls{u, {}, 0, false};
    for (int stage = 0; stage <= 2; ++stage) {
      std::vector<const ParamDef*> sub;
      for (const ParamDef* d : accepted)
        if (d->stage <= stage) sub.push_back(d);
      if (sub.empty() || (stage < 2 && sub.size() == accepted.size())) continue;
      const Coords cs{sub};
      Eigen::VectorXd us(static_cast<Eigen::Index>(cs.size()));
      const ModelParams at = pb.params(c, ls.u);
      for (std::size_t j = 0; j < cs.size(); ++j) us[static_cast<Eigen::Index>(j)] = cs.to_u(j, sub[j]->get(at));
      const Problem::Fixed fixed(pb, c, ls.u);
      const LmResult part = levenberg_marquardt(pb, cs, us, opt.max_iterations);
      res.iterations += part.iterations;
      const ModelParams after = pb.params(cs, part.u);
      for (std::size_t j = 0; j < c.size(); ++j) ls.u[static_cast<Eigen::Index>(j)] = c.to_u(j, accepted[j]->get(after));
      ls.r = part.r;
      ls.converged = part.converged;
    }
    if (ls.r.size() == 0) ls.r = pb.residuals(c, ls.u);
    // Classes of observations the model fits worse than their stated noise count less; then
    // once more from there under those weights.
    pb.reweight(ls.r);
    {
      const LmResult again_ls = levenberg_marquardt(pb, c, ls.u, opt.max_iterations);
      res.iterations += again_ls.iterations;
      ls = again_ls;
    }
    lm = ls;
    if (opt.robust_scale > 0) {
      pb.set_robust(opt.robust_scale);
      lm = levenberg_marquardt(pb, c, ls.u, opt.max_iterations);
      res.iterations += lm.iterations;
    }
    current = pb.params(c, lm.u);
    // Uncertainty of each fitted parameter, from the least-squares residuals at the fitted
    // point (the Cauchy loss flattens the Jacobian of observations the model misses, which
    // would make well-measured parameters look loose); one the fit leaves almost free is refused.
    pb.set_robust(0);
    const Eigen::VectorXd r_ls = pb.residuals(c, lm.u);
    const Eigen::MatrixXd J = pb.jacobian(c, lm.u, r_ls);
    const int dof = static_cast<int>(pb.n()) - static_cast<int>(c.size());
    const double s2 = dof > 0 ? r_ls.squaredNorm() / dof : 1.0;
    const Eigen::MatrixXd cov = s2 * (J.transpose() * J).completeOrthogonalDecomposition().pseudoInverse();
    // The least determined parameter (its relative standard deviation), if any is too loose.
    const ParamDef* poorest = nullptr;
    const double worst_rel = opt.max_rel_sd;
    res.fitted.clear();
    for (std::size_t j = 0; j < c.size(); ++j) {
      const auto jj = static_cast<Eigen::Index>(j);
      const ParamDef& d = *accepted[j];
      FittedParam fp;
      fp.def = &d;
      fp.initial = d.get(start);
      fp.value = c.from_u(j, lm.u[jj]);
      const double sd_u = std::sqrt(std::max(cov(jj, jj), 0.0));
      fp.sd = d.log_scale ? fp.value * sd_u : sd_u * d.typical;
      fp.at_bound = lm.u[jj] <= c.lo(j) + 1e-9 || lm.u[jj] >= c.hi(j) - 1e-9;
      double rel = d.log_scale ? sd_u : fp.sd / std::max(std::abs(fp.value), d.typical);
      // A parameter the fitted point no longer depends on (an algorithm the model stopped
      // picking) is not determined, whatever the arithmetic says.
      if (J.col(jj).norm() <= 1e-9 * std::sqrt(static_cast<double>(J.rows()))) rel = opt.max_rel_sd * 2;
      if (fp.at_bound) {
        // At a bound the local curvature says little: the data determine the parameter if
        // taking it back to where it started costs more than a 2-sigma change would.
        Eigen::VectorXd back = lm.u;
        back[jj] = c.to_u(j, fp.initial);
        const double d_ssr = pb.residuals(c, back).squaredNorm() - r_ls.squaredNorm();
        rel = d_ssr > 4 * s2 ? 0.0 : std::max(rel, opt.max_rel_sd * 1.0000001);
      }
      if (rel > worst_rel) poorest = &d;  // the last in priority order of those too loose
      res.fitted.push_back(fp);
    }
    res.dof = dof;
    res.sigma = std::sqrt(s2);
    bool again = false;
    if (poorest != nullptr) {
      // One at a time: without it, the others may be determined well.
      const ParamDef* d = poorest;
      const auto& fp = *std::find_if(res.fitted.begin(), res.fitted.end(), [&](const FittedParam& f) { return f.def == d; });
      refused.push_back({d->name, fmt::format("poorly determined by these observations ({} ± {}{}); {} would determine it",
                                              fmt_value(*d, fp.value), fmt_value(*d, fp.sd),
                                              fp.at_bound ? ", pushed to its bound" : "", d->determined_by)});
      accepted.erase(std::find(accepted.begin(), accepted.end(), d));
      dropped_poor.push_back(d);
      again = true;
    } else if (!retried) {
      retried = true;
      // Parameters refused at the start may matter at the fitted point (a kernel that turned
      // FLOP-bound): screen them again there.
      std::vector<const ParamDef*> retry;
      std::vector<Refusal> keep_refused;
      for (const auto& rf : refused) {
        const ParamDef* d = find_param(rf.name);
        if (std::find(dropped_poor.begin(), dropped_poor.end(), d) != dropped_poor.end()) keep_refused.push_back(rf);
        else retry.push_back(d);
      }
      const std::size_t before = accepted.size();
      pb.set_robust(0);
      std::vector<Refusal> still = screen(current, retry);
      for (const auto& [d, v] : moves) d->set(current, v);
      moves.clear();
      if (accepted.size() > before) {
        refused = keep_refused;
        refused.insert(refused.end(), still.begin(), still.end());
        again = true;
      }
    }
    if (!again) break;
  }
  res.refused = refused;
  res.after = current;
  res.converged = lm.converged;
  res.evaluations = pb.evaluations();
  for (const auto& fp : res.fitted)
    if (fp.at_bound)
      res.notes.push_back(fmt::format("{} ended at its bound ({}): the data push it beyond what the model allows; its "
                                      "uncertainty is not meaningful",
                                      fp.def->name, fmt_value(*fp.def, fp.value)));
  if (!res.converged && !res.fitted.empty())
    res.notes.push_back(fmt::format("the fit stopped after {} iterations without converging", res.iterations));
  // Predictions before and after, for every observation (held-out ones too).
  predict(start, {}, res.pred_before);
  predict(current, {}, res.pred_after);
  auto cost_of = [&](const std::vector<double>& pred) {
    double s = 0;
    for (std::size_t i = 0; i < obs.size(); ++i)
      if (obs[i].fit) {
        const double sp = obs[i].spread;
        const double w = 1.0 / std::sqrt(sp * sp + opt.model_floor * opt.model_floor);
        const double x = log_ratio(pred[i], obs[i]), sc = opt.robust_scale;
        const double rho = sc > 0 ? sc * sc * std::log1p(x * x / (sc * sc)) : x * x;
        s += 0.5 * w * w * rho;
      }
    return s;
  };
  res.cost_before = cost_of(res.pred_before);
  res.cost_after = cost_of(res.pred_after);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

FitResult fit_in_two_passes(const PredictFn& predict, const std::vector<Observation>& obs, const ModelParams& start,
                            const FitOptions& opt, const std::function<bool(const Observation&)>& is_later,
                            const std::vector<const ParamDef*>& later) {
  auto is_later_param = [&](const ParamDef* d) { return std::find(later.begin(), later.end(), d) != later.end(); };
  std::vector<Observation> first_obs = obs, second_obs = obs;
  bool any_later = false;
  for (std::size_t i = 0; i < obs.size(); ++i) {
    const bool l = obs[i].fit && is_later(obs[i]);
    any_later |= l;
    if (l) first_obs[i].fit = false;
    else second_obs[i].fit = false;
  }
  FitOptions o1 = opt, o2 = opt;
  o1.candidates.clear();
  o2.candidates.clear();
  for (const ParamDef* d : opt.candidates) (is_later_param(d) ? o2 : o1).candidates.push_back(d);
  if (!any_later || o2.candidates.empty()) return fit(predict, obs, start, opt);
  FitResult a = fit(predict, first_obs, start, o1);
  const FitResult b = fit(predict, second_obs, a.after, o2);
  FitResult r = std::move(a);
  r.after = b.after;
  r.fitted.insert(r.fitted.end(), b.fitted.begin(), b.fitted.end());  // their start is `start`'s: pass 1 held them
  r.refused.insert(r.refused.end(), b.refused.begin(), b.refused.end());
  r.notes.insert(r.notes.end(), b.notes.begin(), b.notes.end());
  std::string names;
  for (const ParamDef* d : o2.candidates) names += (names.empty() ? "" : ", ") + d->name;
  r.notes.push_back(fmt::format("{} fitted after the rest, on their own observations, with the rest held", names));
  r.pred_after = b.pred_after;
  r.iterations += b.iterations;
  r.evaluations += b.evaluations;
  r.n_fit += b.n_fit;
  r.dof += b.dof;
  r.cost_after += b.cost_after;
  r.cost_before += b.cost_before;
  r.converged = r.converged && b.converged;
  r.seconds += b.seconds;
  return r;
}

AlphaBeta fit_alpha_beta(const std::vector<double>& bytes, const std::vector<double>& seconds) {
  AlphaBeta ab;
  const std::size_t n = std::min(bytes.size(), seconds.size());
  ab.points = static_cast<int>(n);
  if (n < 2) return ab;
  // Rows (1/t, S/t) · (α, b) ≈ 1: relative errors, linear in α and b = 1/β.
  Eigen::MatrixXd X(static_cast<Eigen::Index>(n), 2);
  Eigen::VectorXd y = Eigen::VectorXd::Ones(static_cast<Eigen::Index>(n));
  for (std::size_t i = 0; i < n; ++i) {
    X(static_cast<Eigen::Index>(i), 0) = 1.0 / seconds[i];
    X(static_cast<Eigen::Index>(i), 1) = bytes[i] / seconds[i];
  }
  Eigen::Vector2d c = X.colPivHouseholderQr().solve(y);
  bool alpha_fixed = false;
  if (c[0] < 0) {  // no negative latency: b alone
    alpha_fixed = true;
    c[0] = 0;
    c[1] = X.col(1).dot(y) / X.col(1).squaredNorm();
  }
  const Eigen::VectorXd r = X * c - y;
  const int dof = static_cast<int>(n) - (alpha_fixed ? 1 : 2);
  const double s2 = dof > 0 ? r.squaredNorm() / dof : 0;
  ab.rms_rel = std::sqrt(r.squaredNorm() / static_cast<double>(n));
  ab.alpha_s = c[0];
  ab.beta = c[1] > 0 ? 1.0 / c[1] : 0;
  if (alpha_fixed) {
    ab.beta_rel_sd = c[1] > 0 ? std::sqrt(s2 / X.col(1).squaredNorm()) / c[1] : 0;
  } else {
    const Eigen::Matrix2d cov = s2 * (X.transpose() * X).inverse();
    ab.alpha_sd = std::sqrt(std::max(cov(0, 0), 0.0));
    ab.beta_rel_sd = c[1] > 0 ? std::sqrt(std::max(cov(1, 1), 0.0)) / c[1] : 0;
  }
  return ab;
}

GemmCurve fit_gemm_curve(const std::vector<std::array<double, 3>>& mnk, const std::vector<double>& efficiency) {
  GemmCurve gc;
  const std::size_t n = std::min(mnk.size(), efficiency.size());
  gc.points = static_cast<int>(n);
  if (n < 2) return gc;
  auto shape = [&](std::size_t i, double h) {
    double s = 0;
    for (double x : mnk[i]) s += std::log(x / (x + h));
    return s;
  };
  // For a given h the best log A is the mean of log e − Σ log s; the SSR is a function of h alone.
  auto ssr_at = [&](double logh, double* loga) {
    const double h = std::exp(logh);
    double mean = 0;
    for (std::size_t i = 0; i < n; ++i) mean += std::log(efficiency[i]) - shape(i, h);
    mean /= static_cast<double>(n);
    double s = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double r = std::log(efficiency[i]) - shape(i, h) - mean;
      s += r * r;
    }
    if (loga) *loga = mean;
    return s;
  };
  double a = 0, b = std::log(1e5);
  const double phi = (std::sqrt(5.0) - 1) / 2;
  double x1 = b - phi * (b - a), x2 = a + phi * (b - a);
  double f1 = ssr_at(x1, nullptr), f2 = ssr_at(x2, nullptr);
  for (int it = 0; it < 80; ++it) {
    if (f1 < f2) {
      b = x2;
      x2 = x1;
      f2 = f1;
      x1 = b - phi * (b - a);
      f1 = ssr_at(x1, nullptr);
    } else {
      a = x1;
      x1 = x2;
      f1 = f2;
      x2 = a + phi * (b - a);
      f2 = ssr_at(x2, nullptr);
    }
  }
  const double logh = 0.5 * (a + b);
  double loga = 0;
  const double ssr = ssr_at(logh, &loga);
  gc.half_dim = std::exp(logh);
  gc.max_efficiency = std::exp(loga);
  gc.rms_rel = std::sqrt(ssr / static_cast<double>(n));
  // Uncertainty: the Jacobian of the residuals in (log A, log h).
  Eigen::MatrixXd J(static_cast<Eigen::Index>(n), 2);
  const double h = gc.half_dim;
  for (std::size_t i = 0; i < n; ++i) {
    double d = 0;  // d/dlogh of −Σ log(x/(x+h)) = Σ h/(x+h)
    for (double x : mnk[i]) d += h / (x + h);
    J(static_cast<Eigen::Index>(i), 0) = -1;
    J(static_cast<Eigen::Index>(i), 1) = d;
  }
  if (n > 2) {
    const Eigen::Matrix2d cov = ssr / static_cast<double>(n - 2) * (J.transpose() * J).completeOrthogonalDecomposition().pseudoInverse();
    gc.max_efficiency_rel_sd = std::sqrt(std::max(cov(0, 0), 0.0));
    gc.half_dim_rel_sd = std::sqrt(std::max(cov(1, 1), 0.0));
  }
  return gc;
}

}  // namespace zp::calibration
