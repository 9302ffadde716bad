#pragma once
// The one place the kernels include Eigen.
//
// Eigen is a system include (-isystem), so its own code never warns. GCC 12 still reports
// -Wmaybe-uninitialized inside its own avx512fintrin.h (the `__Y = __Y` idiom of
// _mm512_undefined_ps, GCC PR 105593, fixed in GCC 13) when Eigen's AVX-512 paths are
// compiled; the location it reports is inside that header, so ignoring the warning for the
// headers included here silences it there and nowhere in our code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
