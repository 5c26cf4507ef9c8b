// gpubox-p2p-probe: value-checked peer-to-peer copy between every ordered pair of GPUs.
//
// Why: on consumer GPUs the driver's P2P matrix (`nvidia-smi topo -p2p r`) can say OK while the
// path hangs or returns wrong data, so a copy is made and every word is compared.
//
// For each ordered pair (i, j), i != j:
//   - cudaDeviceCanAccessPeer(i -> j) false            -> "NO_PEER_ACCESS"
//   - else enable peer access both ways, fill a buffer on i with a pattern that depends on (i, j),
//     poison the destination on j, cudaMemcpyPeer i -> j, copy j's buffer back to the host and
//     compare every 32-bit word                           -> "OK" | "MISMATCH" | "ERROR: <cuda error>"
// No kernel is launched (the pattern is made on the host), so the binary does not depend on having
// machine code for the GPU's architecture.
//
// Output: one JSON object on stdout, e.g.
//   {"pairs": {"0-1": "OK", "1-0": "OK"}, "devices": 2, "cuda_runtime": 12020, "cuda_driver": 12020,
//    "pci_bus_ids": ["0000:01:00.0", ...], "bytes": 67108864, "copy_gbps": {"0-1": 48.1, ...}}
// Device indices follow PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID is forced) so that they match
// nvidia-smi's indices.
//
// Exit status: 0 all pairs with peer access verified; 1 at least one pair MISMATCH or ERROR;
// 2 the probe could not run at all (no CUDA device, runtime/driver init failure): the JSON then
// carries "error" and the caller should treat the probe as unavailable.
//
// Build: nvcc -O2 -o gpubox-p2p-probe gpubox-p2p-probe.cu

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

constexpr size_t kDefaultBytes = size_t{64} << 20;  // 64 MiB per copy

struct PairResult {
  std::string key;
  std::string status;
  double gbps;  // < 0 when not measured
};

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string cuda_error_text(cudaError_t err) {
  return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
}

// Pattern word k of the buffer sent from device i to device j: distinct per pair and per word, so
// a copy that lands in the wrong place or comes from the wrong source is caught.
uint32_t pattern(int i, int j, size_t k) {
  uint32_t x = static_cast<uint32_t>(k) * 2654435761u;
  x ^= (static_cast<uint32_t>(i) + 1u) * 0x9E3779B1u;
  x ^= (static_cast<uint32_t>(j) + 1u) * 0x85EBCA77u;
  x ^= x >> 15;
  return x;
}

// Runs the copy for one ordered pair. Returns "OK", "MISMATCH ..." or "ERROR: ...".
PairResult probe_pair(int src, int dst, size_t bytes, std::vector<uint32_t>& host) {
  PairResult r{std::to_string(src) + "-" + std::to_string(dst), "", -1.0};
  const size_t words = bytes / sizeof(uint32_t);
  void* d_src = nullptr;
  void* d_dst = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  cudaError_t err = cudaSuccess;
  size_t bad = 0;
  size_t first_bad = 0;
  float ms = 0.0f;

#define PROBE_CHECK(call)                          \
  do {                                             \
    err = (call);                                  \
    if (err != cudaSuccess) {                      \
      r.status = "ERROR: " + cuda_error_text(err); \
      goto cleanup;                                \
    }                                              \
  } while (0)

  for (size_t k = 0; k < words; ++k) host[k] = pattern(src, dst, k);

  PROBE_CHECK(cudaSetDevice(src));
  PROBE_CHECK(cudaMalloc(&d_src, bytes));
  PROBE_CHECK(cudaMemcpy(d_src, host.data(), bytes, cudaMemcpyHostToDevice));
  PROBE_CHECK(cudaEventCreate(&start));
  PROBE_CHECK(cudaEventCreate(&stop));

  PROBE_CHECK(cudaSetDevice(dst));
  PROBE_CHECK(cudaMalloc(&d_dst, bytes));
  PROBE_CHECK(cudaMemset(d_dst, 0xA5, bytes));  // poison: a copy that does nothing must fail
  PROBE_CHECK(cudaDeviceSynchronize());

  PROBE_CHECK(cudaSetDevice(src));
  PROBE_CHECK(cudaEventRecord(start, 0));
  PROBE_CHECK(cudaMemcpyPeerAsync(d_dst, dst, d_src, src, bytes, 0));
  PROBE_CHECK(cudaEventRecord(stop, 0));
  PROBE_CHECK(cudaEventSynchronize(stop));
  PROBE_CHECK(cudaEventElapsedTime(&ms, start, stop));
  if (ms > 0.0f) r.gbps = static_cast<double>(bytes) / (static_cast<double>(ms) * 1e6);

  std::fill(host.begin(), host.end(), 0u);
  PROBE_CHECK(cudaSetDevice(dst));
  PROBE_CHECK(cudaMemcpy(host.data(), d_dst, bytes, cudaMemcpyDeviceToHost));
  for (size_t k = 0; k < words; ++k) {
    if (host[k] != pattern(src, dst, k)) {
      if (bad == 0) first_bad = k;
      ++bad;
    }
  }
  if (bad == 0) {
    r.status = "OK";
  } else {
    r.status = "MISMATCH";
    std::fprintf(stderr, "gpubox-p2p-probe: %s: %zu of %zu words differ, first at word %zu\n",
                 r.key.c_str(), bad, words, first_bad);
  }

cleanup:
#undef PROBE_CHECK
  if (d_src != nullptr) {
    cudaSetDevice(src);
    cudaFree(d_src);
  }
  if (d_dst != nullptr) {
    cudaSetDevice(dst);
    cudaFree(d_dst);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  return r;
}

// Enables access from `from` to `to`; "already enabled" counts as success.
cudaError_t enable_peer(int from, int to) {
  cudaError_t err = cudaSetDevice(from);
  if (err != cudaSuccess) return err;
  err = cudaDeviceEnablePeerAccess(to, 0);
  if (err == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();  // clear the sticky-free error state
    return cudaSuccess;
  }
  return err;
}

void print_fatal(const std::string& message, int runtime_version, int driver_version) {
  std::printf(
      "{\"pairs\": {}, \"devices\": 0, \"cuda_runtime\": %d, \"cuda_driver\": %d, \"error\": \"%s\"}\n",
      runtime_version, driver_version, json_escape(message).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = kDefaultBytes;
  for (int a = 1; a < argc; ++a) {
    std::string arg = argv[a];
    if (arg == "--mib" && a + 1 < argc) {
      bytes = static_cast<size_t>(std::strtoull(argv[++a], nullptr, 10)) << 20;
    } else {
      std::fprintf(stderr, "usage: %s [--mib N]   (default 64)\n", argv[0]);
      return 2;
    }
  }
  if (bytes == 0) bytes = kDefaultBytes;

  // Match nvidia-smi's numbering (PCI bus order) rather than CUDA's default fastest-first order.
  setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID", 1);

  int runtime_version = 0;
  int driver_version = 0;
  cudaRuntimeGetVersion(&runtime_version);
  cudaDriverGetVersion(&driver_version);

  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    print_fatal(cuda_error_text(err), runtime_version, driver_version);
    return 2;
  }

  std::vector<std::string> bus_ids;
  for (int d = 0; d < n; ++d) {
    char buf[32] = {0};
    if (cudaDeviceGetPCIBusId(buf, sizeof buf, d) != cudaSuccess) buf[0] = '\0';
    bus_ids.emplace_back(buf);
  }

  std::vector<uint32_t> host(bytes / sizeof(uint32_t));
  std::vector<PairResult> results;
  bool all_ok = true;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (i == j) continue;
      const std::string key = std::to_string(i) + "-" + std::to_string(j);
      int can_ij = 0;
      int can_ji = 0;
      err = cudaDeviceCanAccessPeer(&can_ij, i, j);
      if (err == cudaSuccess) err = cudaDeviceCanAccessPeer(&can_ji, j, i);
      if (err != cudaSuccess) {
        results.push_back({key, "ERROR: " + cuda_error_text(err), -1.0});
        all_ok = false;
        continue;
      }
      if (!can_ij || !can_ji) {
        results.push_back({key, "NO_PEER_ACCESS", -1.0});
        continue;
      }
      err = enable_peer(i, j);
      if (err == cudaSuccess) err = enable_peer(j, i);
      if (err != cudaSuccess) {
        results.push_back({key, "ERROR: " + cuda_error_text(err), -1.0});
        all_ok = false;
        continue;
      }
      PairResult r = probe_pair(i, j, bytes, host);
      if (r.status != "OK") all_ok = false;
      std::fprintf(stderr, "gpubox-p2p-probe: %s %s\n", r.key.c_str(), r.status.c_str());
      results.push_back(r);
    }
  }

  std::string out = "{\"pairs\": {";
  for (size_t k = 0; k < results.size(); ++k) {
    if (k) out += ", ";
    out += "\"" + results[k].key + "\": \"" + json_escape(results[k].status) + "\"";
  }
  out += "}, \"devices\": " + std::to_string(n);
  out += ", \"cuda_runtime\": " + std::to_string(runtime_version);
  out += ", \"cuda_driver\": " + std::to_string(driver_version);
  out += ", \"pci_bus_ids\": [";
  for (size_t k = 0; k < bus_ids.size(); ++k) {
    if (k) out += ", ";
    out += "\"" + json_escape(bus_ids[k]) + "\"";
  }
  out += "], \"bytes\": " + std::to_string(bytes) + ", \"copy_gbps\": {";
  bool first = true;
  for (const PairResult& r : results) {
    if (r.gbps < 0) continue;
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s\"%s\": %.1f", first ? "" : ", ", r.key.c_str(), r.gbps);
    out += buf;
    first = false;
  }
  out += "}}";
  std::printf("%s\n", out.c_str());
  return all_ok ? 0 : 1;
}
