#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include <unistd.h>

#include "server/net/tls_context.hpp"

using namespace wspush::server;

TEST_CASE("tls: ticket keys seal with the newest, open the kept ones, retire the rest") {
  ticket_keys keys(std::chrono::hours(1), 2);
  const ticket_keys::key first = keys.sealing_key();
  ticket_keys::key k;
  bool newest = false;
  REQUIRE(keys.opening_key(first.name.data(), k, newest));
  CHECK(newest);
  CHECK(k.aes == first.aes);

  keys.rotate();  // a ticket sealed before still opens, and is renewed (not the newest key)
  const ticket_keys::key second = keys.sealing_key();
  CHECK(second.name != first.name);
  REQUIRE(keys.opening_key(first.name.data(), k, newest));
  CHECK_FALSE(newest);

  keys.rotate();  // two rotations later the first key is gone: a full handshake
  CHECK_FALSE(keys.opening_key(first.name.data(), k, newest));
  REQUIRE(keys.opening_key(second.name.data(), k, newest));
  CHECK_FALSE(newest);
}

TEST_CASE("tls: the schedule rotates when the newest key is due") {
  ticket_keys keys(std::chrono::seconds(0), 2);  // always due
  const auto a = keys.sealing_key();
  const auto b = keys.sealing_key();
  CHECK(a.name != b.name);
}

TEST_CASE("tls: unusable files are refused with a message naming them") {
  char dir[] = "/tmp/wspush-tls-test-XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  const std::string cert = std::string(dir) + "/cert.pem", key = std::string(dir) + "/key.pem";
  CHECK_THROWS_WITH(tls_server(tls_files{cert, key}), Catch::Contains(cert));
  std::ofstream(cert) << "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n";
  CHECK_THROWS_WITH(tls_server(tls_files{cert, key}), Catch::Contains(cert));
  std::remove(cert.c_str());
  rmdir(dir);
}

TEST_CASE("tls: kernel TLS detection answers, with a reason when it is not offered") {
  std::string why;
  const bool offered = kernel_tls_available(why);
  if (!offered) CHECK_FALSE(why.empty());
}
