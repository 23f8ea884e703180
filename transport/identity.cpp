#include "transport/identity.hpp"
#include "transport/state_dir.hpp"
#include "base/durable_file.hpp"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace mesh::transport {

namespace {

// File layout: magic, seed, public key. The public key is redundant on purpose: re-deriving it
// from the seed and comparing catches a truncated or bit-flipped file instead of silently
// becoming another node.
constexpr char magic[8] = {'M', 'E', 'S', 'H', 'K', 'E', 'Y', '1'};
constexpr size_t file_size = sizeof(magic) + 32 + 32;

std::string errno_text() { return std::strerror(errno); }

bool sodium_ready() {
  static const bool ok = sodium_init() >= 0;
  return ok;
}

expected<identity> read_key_file(const std::filesystem::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return make_error(error_code::io_error, "cannot open key file " + path.string() + ": " + errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return make_error(error_code::io_error, "cannot stat key file " + path.string() + ": " + errno_text());
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(error_code::invalid_argument, "key file " + path.string() + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return make_error(error_code::invalid_argument,
                      "key file " + path.string() +
                          " is readable by group or others; refusing to use it (run chmod 600 on it)");
  }
  std::array<uint8_t, file_size + 1> buf{};
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = ::read(fd, buf.data() + got, buf.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return make_error(error_code::io_error, "cannot read key file " + path.string() + ": " + errno_text());
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  if (got != file_size || std::memcmp(buf.data(), magic, sizeof(magic)) != 0)
    return make_error(error_code::decode_error,
                      "key file " + path.string() + " is corrupt (wrong size or header); move it away to "
                      "create a new identity");
  std::array<uint8_t, 32> seed{}, stored_pk{};
  std::memcpy(seed.data(), buf.data() + sizeof(magic), 32);
  std::memcpy(stored_pk.data(), buf.data() + sizeof(magic) + 32, 32);
  identity id = identity::from_seed(seed);
  sodium_memzero(seed.data(), seed.size());
  sodium_memzero(buf.data(), buf.size());
  if (id.public_key() != stored_pk)
    return make_error(error_code::decode_error,
                      "key file " + path.string() + " is corrupt (public key does not match the seed)");
  return id;
}

expected<void> write_key_file(const std::filesystem::path& path, const identity& id) {
  std::array<uint8_t, file_size> buf{};
  std::memcpy(buf.data(), magic, sizeof(magic));
  std::memcpy(buf.data() + sizeof(magic), id.seed().data(), 32);
  std::memcpy(buf.data() + sizeof(magic) + 32, id.public_key().data(), 32);
  // Written to a temporary name and renamed, so a crash never leaves a half-written key.
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  ::unlink(tmp.c_str());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0)
    return make_error(error_code::io_error, "cannot create key file " + tmp.string() + ": " + errno_text());
  ::fchmod(fd, 0600);  // the umask may have removed bits, never added them; be explicit anyway
  size_t put = 0;
  while (put < buf.size()) {
    ssize_t n = ::write(fd, buf.data() + put, buf.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      ::unlink(tmp.c_str());
      return make_error(error_code::io_error, "cannot write key file " + tmp.string() + ": " + errno_text());
    }
    put += static_cast<size_t>(n);
  }
  sodium_memzero(buf.data(), buf.size());
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    return make_error(error_code::io_error, "cannot flush key file " + tmp.string() + ": " + errno_text());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return make_error(error_code::io_error, "cannot rename key file into " + path.string() + ": " + errno_text());
  }
  return sync_directory(path.parent_path());  // the rename itself must survive a power cut
}

}  // namespace

identity identity::from_seed(const std::array<uint8_t, 32>& seed) {
  sodium_ready();
  identity id;
  std::array<uint8_t, 64> sk{};
  crypto_sign_seed_keypair(id.public_key_.data(), sk.data(), seed.data());
  id.seed_ = seed;
  sodium_memzero(sk.data(), sk.size());
  return id;
}

identity identity::generate() {
  sodium_ready();
  std::array<uint8_t, 32> seed{};
  randombytes_buf(seed.data(), seed.size());
  identity id = from_seed(seed);
  sodium_memzero(seed.data(), seed.size());
  return id;
}

std::array<uint8_t, 64> identity::secret_key() const {
  std::array<uint8_t, 64> sk{};
  std::memcpy(sk.data(), seed_.data(), 32);
  std::memcpy(sk.data() + 32, public_key_.data(), 32);
  return sk;
}

expected<identity> identity::load_or_create(const std::filesystem::path& state_dir) {
  if (!sodium_ready()) return make_error(error_code::internal, "libsodium failed to initialise");
  if (auto ok = prepare_state_dir(state_dir); !ok) return tl::unexpected(ok.error());
  const auto path = state_dir / identity_file_name;
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return read_key_file(path);
  if (errno != ENOENT)
    return make_error(error_code::io_error, "cannot stat key file " + path.string() + ": " + errno_text());
  identity id = generate();
  if (auto w = write_key_file(path, id); !w) return tl::unexpected(w.error());
  return id;
}

}  // namespace mesh::transport
