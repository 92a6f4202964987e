#include <catch2/catch.hpp>

#include <cstdlib>
#include <unistd.h>
#include <string>
#include <vector>

#include "server/app/config.hpp"

using namespace wspush::server;

namespace {
config parse_raw(std::vector<std::string> args) {
  std::vector<char*> argv{const_cast<char*>("wspush")};
  for (auto& a : args) argv.push_back(a.data());
  return parse_config(int(argv.size()), argv.data());
}
// Most cases are about other options: run them without auth.
config parse(std::vector<std::string> args) {
  args.insert(args.begin(), "--auth=none");
  return parse_raw(std::move(args));
}
}  // namespace

TEST_CASE("config: defaults and both option spellings") {
  config d = parse({});
  CHECK(d.listen == "0.0.0.0:8080");
  CHECK(d.mode == app_mode::pubsub);
  CHECK(d.conn.max_message_bytes == 64u << 10);  // client messages are small in pubsub mode
  CHECK(d.history_size == 100);
  CHECK(parse({"--mode=echo"}).conn.max_message_bytes == 16u << 20);
  CHECK(parse({"--mode=pubsub", "--max-message-bytes=1000"}).conn.max_message_bytes == 1000);
  config c = parse({"--listen", "127.0.0.1:0", "--mode=echo", "--io", "epoll", "--threads=3", "--upgrade-timeout", "0.5"});
  CHECK(c.listen == "127.0.0.1:0");
  CHECK(c.mode == app_mode::echo);
  CHECK(c.io == io_kind::epoll);
  CHECK(c.threads == 3);
  CHECK(c.conn.upgrade_timeout == Approx(0.5));
}

TEST_CASE("config: environment variables, overridden by the command line") {
  ::setenv("WSPUSH_MAX_CONNECTIONS", "1234", 1);
  ::setenv("WSPUSH_MODE", "echo", 1);
  config c = parse({"--mode", "broadcast"});
  ::unsetenv("WSPUSH_MAX_CONNECTIONS");
  ::unsetenv("WSPUSH_MODE");
  CHECK(c.conn.max_connections == 1234);
  CHECK(c.mode == app_mode::broadcast);
}

TEST_CASE("config: bad input is refused with a message naming the option") {
  CHECK_THROWS_WITH(parse({"--mode=chat"}), Catch::Contains("--mode"));
  CHECK_THROWS_WITH(parse_raw({"--jwt-secret=s", "--allow-client-publish"}), Catch::Contains("--allow-client-publish"));
  CHECK_THROWS_WITH(parse({"--history-ttl", "0"}), Catch::Contains("--history-ttl"));
  CHECK_THROWS_WITH(parse({"--threads", "many"}), Catch::Contains("--threads"));
  CHECK_THROWS_WITH(parse({"--no-such-thing"}), Catch::Contains("unknown option"));
  CHECK_THROWS_WITH(parse({"--listen"}), Catch::Contains("needs a value"));
  CHECK_THROWS_WITH(parse({"--close-timeout=-1"}), Catch::Contains("seconds"));
  CHECK_THROWS(parse({"stray"}));
  CHECK_THROWS_WITH(parse({"--tls-cert", "a.pem"}), Catch::Contains("--tls-key"));
  CHECK_THROWS_WITH(parse({"--tls-key", "k.pem"}), Catch::Contains("--tls-cert"));
  CHECK(parse({"--tls-cert", "a.pem", "--tls-key", "k.pem"}).tls_cert == "a.pem");
  // Durable publishes: Redis replicas only, and a wait the stall check does not take for a stall.
  CHECK_THROWS_WITH(parse({"--redis-wait-replicas", "1"}), Catch::Contains("--bus=redis://"));
  CHECK_THROWS_WITH(parse({"--bus", "redis://127.0.0.1:6379", "--redis-wait-replicas", "1", "--redis-wait-ms", "1500"}),
                    Catch::Contains("--redis-timeout"));
  // Redis credentials and TLS: for a Redis bus, an ACL user needs a password, files go in pairs.
  CHECK_THROWS_WITH(parse({"--bus", "redis://app@127.0.0.1:6379"}), Catch::Contains("needs a password"));
  CHECK_THROWS_WITH(parse({"--redis-tls-ca", "ca.pem"}), Catch::Contains("--bus=redis://"));
  CHECK_THROWS_WITH(parse({"--bus", "redis://127.0.0.1:6379", "--redis-tls-ca", "ca.pem"}), Catch::Contains("rediss://"));
  CHECK_THROWS_WITH(parse({"--bus", "rediss://127.0.0.1:6379", "--redis-tls-cert", "c.pem"}), Catch::Contains("go together"));
  CHECK_THROWS_WITH(parse({"--bus", "redis://127.0.0.1:6379", "--redis-password-file", "/nonexistent/pw"}),
                    Catch::Contains("--redis-password-file: cannot read"));
  CHECK(parse({"--bus", "rediss://app:pw@127.0.0.1:6379", "--redis-tls-ca", "ca.pem"}).redis_tls.ca == "ca.pem");
  config d = parse({"--bus", "redis://127.0.0.1:6379", "--redis-wait-replicas", "2", "--redis-wait-ms", "250"});
  CHECK(d.redis_wait_replicas == 2);
  CHECK(d.redis_wait_ms == 250);
}

TEST_CASE("config: --idempotency-window is 300 s unless said otherwise and at least 1 s") {
  CHECK(parse({}).idempotency_window == 300);
  CHECK(parse({"--idempotency-window", "60"}).idempotency_window == 60);
  CHECK(parse({"--idempotency-window=1.5"}).idempotency_window == 1.5);
  CHECK_THROWS_WITH(parse({"--idempotency-window", "0.5"}), Catch::Contains("--idempotency-window"));
  CHECK_THROWS_WITH(parse({"--idempotency-window", "0"}), Catch::Contains("--idempotency-window"));
  CHECK_THROWS_WITH(parse({"--idempotency-window", "soon"}), Catch::Contains("--idempotency-window"));
  CHECK_THAT(help_text(), Catch::Contains("--idempotency-window SECONDS") && Catch::Contains("[default: 300]"));
}

TEST_CASE("config: --kernel-tls is auto unless said otherwise") {
  CHECK(parse({}).kernel_tls == kernel_tls_mode::automatic);
  CHECK(parse({"--kernel-tls=off"}).kernel_tls == kernel_tls_mode::off);
  CHECK(parse({"--kernel-tls", "on"}).kernel_tls == kernel_tls_mode::on);
  CHECK(parse({"--kernel-tls=auto"}).kernel_tls == kernel_tls_mode::automatic);
  CHECK_THROWS_WITH(parse({"--kernel-tls=yes"}), Catch::Contains("auto, on or off"));
  CHECK_THAT(help_text(), Catch::Contains("--kernel-tls auto|on|off") && Catch::Contains("[default: auto]"));
}

TEST_CASE("config: --help lists every option with its default") {
  std::string h = help_text();
  for (const char* opt : {"--listen", "--mode", "--io", "--threads", "--auth", "--max-frame-bytes", "--max-message-bytes",
                          "--max-pending-bytes", "--upgrade-timeout", "--close-timeout", "--message-timeout",
                          "--ping-interval", "--pong-timeout", "--drain-seconds"})
    CHECK_THAT(h, Catch::Contains(opt));
  CHECK_THAT(h, Catch::Contains("[default: 0.0.0.0:8080]"));
  CHECK(parse({"--help"}).show_help);
}

TEST_CASE("config: a token secret is required unless --auth=none says otherwise") {
  CHECK_THROWS_WITH(parse_raw({}), Catch::Contains("no token secret"));
  CHECK(parse_raw({"--jwt-secret", "s3cret"}).jwt_secret == "s3cret");
  CHECK(parse_raw({"--auth=none"}).auth_none);
  CHECK_THROWS_WITH(parse_raw({"--auth=none", "--jwt-secret=x"}), Catch::Contains("contradict"));
  CHECK_THROWS_WITH(parse_raw({"--jwt-secret="}), Catch::Contains("empty"));
  CHECK_THROWS_WITH(parse_raw({"--jwt-secret-file", "/nonexistent/secret"}), Catch::Contains("cannot read"));
  char path[] = "/tmp/wspush-secret-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, "from-a-file\n", 12) == 12);
  close(fd);
  CHECK(parse_raw({"--jwt-secret-file", path}).jwt_secret == "from-a-file");
  unlink(path);
  CHECK(parse_raw({"--help"}).show_help);  // --help works without a secret
}
