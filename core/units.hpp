#pragma once
// Units live in types: a quantity that crosses a module boundary is one of these,
// never a bare double. Bytes are exact integers; FLOPs and seconds are doubles.
#include <cstdint>
#include <compare>

namespace zp {

struct Bytes {
  std::int64_t v = 0;
  constexpr Bytes() = default;
  constexpr explicit Bytes(std::int64_t x) : v(x) {}
  constexpr Bytes& operator+=(Bytes o) { v += o.v; return *this; }
  constexpr Bytes& operator-=(Bytes o) { v -= o.v; return *this; }
  friend constexpr Bytes operator+(Bytes a, Bytes b) { return Bytes{a.v + b.v}; }
  friend constexpr Bytes operator-(Bytes a, Bytes b) { return Bytes{a.v - b.v}; }
  friend constexpr Bytes operator*(Bytes a, std::int64_t k) { return Bytes{a.v * k}; }
  friend constexpr Bytes operator*(std::int64_t k, Bytes a) { return Bytes{a.v * k}; }
  friend constexpr auto operator<=>(Bytes, Bytes) = default;
  constexpr double mib() const { return static_cast<double>(v) / (1024.0 * 1024.0); }
  constexpr double gib() const { return static_cast<double>(v) / (1024.0 * 1024.0 * 1024.0); }
};

struct Flops {
  double v = 0;
  constexpr Flops() = default;
  constexpr explicit Flops(double x) : v(x) {}
  constexpr Flops& operator+=(Flops o) { v += o.v; return *this; }
  friend constexpr Flops operator+(Flops a, Flops b) { return Flops{a.v + b.v}; }
  friend constexpr Flops operator*(Flops a, double k) { return Flops{a.v * k}; }
  friend constexpr auto operator<=>(Flops, Flops) = default;
};

struct Seconds {
  double v = 0;
  constexpr Seconds() = default;
  constexpr explicit Seconds(double x) : v(x) {}
  constexpr Seconds& operator+=(Seconds o) { v += o.v; return *this; }
  friend constexpr Seconds operator+(Seconds a, Seconds b) { return Seconds{a.v + b.v}; }
  friend constexpr Seconds operator-(Seconds a, Seconds b) { return Seconds{a.v - b.v}; }
  friend constexpr auto operator<=>(Seconds, Seconds) = default;
  constexpr double ms() const { return v * 1e3; }
  constexpr double us() const { return v * 1e6; }
};

struct FlopsPerSecond { double v = 0; };
struct BytesPerSecond { double v = 0; };

}  // namespace zp
