// The control: the valid form of the calls the other files get wrong compiles (so a failure
// there is the misuse, not a broken include path).
#include <span>
#include <vector>

#include <kft/transport/shm/communicator.hpp>

void use(kft::shm::communicator& comm) {
  std::vector<float> a(4), b(4);
  comm.allreduce(std::span<const float>(a), std::span<float>(b), kft::ops::sum);
  auto w = comm.allreduce_async(std::span<float>(b), kft::ops::avg);
  w.wait();
}
