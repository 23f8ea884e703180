// mesh-delay-line NS QUEUE DELAY_MS: holds every packet an NFQUEUE rule in network namespace NS
// hands to queue QUEUE for DELAY_MS, then lets it go (tests/common/kernel_delay_line.hpp), until
// SIGINT or SIGTERM. For bench/serving/split.sh on kernels without sch_netem: with
//   ip netns exec NS iptables -A OUTPUT -o eth0 -j NFQUEUE --queue-num QUEUE
// it stands in for `tc qdisc add dev eth0 root netem delay DELAY_MS`. Not a test.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kernel_delay_line.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: mesh-delay-line NS QUEUE DELAY_MS\n");
    return 2;
  }
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);  // before the line's thread starts: it inherits the mask
  mesh::test::kernel_delay_line line(argv[1], static_cast<uint16_t>(std::atoi(argv[2])),
                                     std::chrono::milliseconds(std::atoi(argv[3])));
  if (!line.ok()) {
    std::fprintf(stderr, "mesh-delay-line: %s\n", line.error().c_str());
    return 1;
  }
  std::printf("delaying queue %s in %s by %s ms\n", argv[2], argv[1], argv[3]);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  std::printf("released %llu packets\n", static_cast<unsigned long long>(line.released()));
  return 0;
}
