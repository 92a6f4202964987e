// --config FILE: options from a TOML file, under the environment and the command line.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <unistd.h>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/app/config.hpp"

using namespace wspush::server;

namespace {

/// A file in /tmp holding `text`, removed with the object.
struct temp_file {
  std::string path;
  explicit temp_file(const std::string& text) {
    char name[] = "/tmp/wspush-config-XXXXXX";
    int fd = mkstemp(name);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, text.data(), text.size()) == ssize_t(text.size()));
    close(fd);
    path = name;
  }
  void rewrite(const std::string& text) const {
    FILE* f = std::fopen(path.c_str(), "w");
    REQUIRE(f);
    std::fputs(text.c_str(), f);
    std::fclose(f);
  }
  ~temp_file() { unlink(path.c_str()); }
};

/// Sets an environment variable for the scope.
struct scoped_env {
  std::string name;
  scoped_env(std::string n, const char* value) : name(std::move(n)) { ::setenv(name.c_str(), value, 1); }
  ~scoped_env() { ::unsetenv(name.c_str()); }
};

config parse(std::vector<std::string> args) {
  std::vector<char*> argv{const_cast<char*>("wspush")};
  for (auto& a : args) argv.push_back(a.data());
  return parse_config(int(argv.size()), argv.data());
}

config parse_file(const temp_file& f, std::vector<std::string> args = {}) {
  args.insert(args.begin(), {"--config", f.path});
  return parse(std::move(args));
}

/// What parsing the file throws (it must throw).
std::string error_of(const std::string& toml) {
  temp_file f(toml);
  try {
    parse_file(f);
  } catch (const config_error& e) {
    return e.what();
  }
  FAIL("no error for:\n" << toml);
  return {};
}

/// `--name` of each line of --help that starts one.
std::vector<std::string> help_options() {
  std::vector<std::string> names;
  std::istringstream in(help_text());
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("  --")) names.push_back(line.substr(4, line.find(' ', 4) - 4));
  return names;
}

}  // namespace

TEST_CASE("config file: the command line wins over the environment which wins over the file") {
  temp_file f(
      "auth = \"none\"\n"
      "max-connections = 10\n"
      "history-size = 20\n"
      "max-topics-per-connection = 30\n"
      "mode = \"echo\"\n"
      "ping-interval = 7\n");
  scoped_env e1("WSPUSH_MAX_CONNECTIONS", "11");
  scoped_env e2("WSPUSH_HISTORY_SIZE", "21");
  config c = parse_file(f, {"--max-connections", "12", "--max-topics-per-connection=32"});
  CHECK(c.conn.max_connections == 12);                   // command line, over the environment and the file
  CHECK(c.session.max_topics_per_connection == 32);      // command line, over the file
  CHECK(c.history_size == 21);                           // environment, over the file
  CHECK(c.mode == app_mode::echo);                       // the file, over the default
  CHECK(c.conn.ping_interval == 7);
  CHECK(c.conn.pong_timeout == config{}.conn.pong_timeout);  // the default
  CHECK(c.config_file == f.path);
  // Where each came from, for SIGHUP's lines.
  CHECK(c.given.at("max-connections").where == "the command line");
  CHECK(c.given.at("history-size").where == "WSPUSH_HISTORY_SIZE");
  CHECK(c.given.at("mode").where == f.path + ":5");
  CHECK(c.in_file.at("max-connections").value == "10");
}

TEST_CASE("config file: WSPUSH_CONFIG names it unless --config does") {
  temp_file a("auth = \"none\"\nhistory-size = 1\n");
  temp_file b("auth = \"none\"\nhistory-size = 2\n");
  scoped_env e("WSPUSH_CONFIG", a.path.c_str());
  CHECK(parse({}).history_size == 1);
  CHECK(parse({}).config_file == a.path);
  CHECK(parse({"--config=" + b.path}).history_size == 2);
  CHECK_THROWS_WITH(parse({"--config="}), Catch::Contains("--config") && Catch::Contains("empty"));
  CHECK_THROWS_WITH(parse({"--config"}), Catch::Contains("--config needs a value"));
}

TEST_CASE("config file: every option is taken with its TOML type") {
  temp_file password("pw\n");
  temp_file f(
      "# every option but the token secrets, which contradict auth = \"none\"\n"
      "listen = \"127.0.0.1:9000\"\n"
      "ws-path = \"/socket\"\n"
      "sse-path = \"/events\"\n"
      "tls-cert = \"cert.pem\"\n"
      "tls-key = \"key.pem\"\n"
      "kernel-tls = \"off\"\n"
      "admin-listen = \"127.0.0.1:9001\"\n"
      "api-key = \"k3y\"\n"
      "max-body-bytes = 2048\n"
      "mode = \"pubsub\"\n"
      "io = \"epoll\"\n"
      "threads = 3\n"
      "auth = \"none\"\n"
      "bus = \"rediss://127.0.0.1:6380/2\"\n"
      "redis-timeout = 2.5\n"
      "redis-password-file = \"" + password.path + "\"\n"
      "redis-tls-ca = \"ca.pem\"\n"
      "redis-tls-cert = \"rc.pem\"\n"
      "redis-tls-key = \"rk.pem\"\n"
      "redis-wait-replicas = 1\n"
      "redis-wait-ms = 250\n"
      "reuseport = true\n"
      "max-connections = 100000\n"
      "max-request-bytes = 4096\n"
      "max-frame-bytes = 1000\n"
      "max-message-bytes = 2000\n"
      "compression = false\n"
      "compression-min-bytes = 512\n"
      "max-pending-bytes = 8192\n"
      "allow-client-publish = true\n"
      "max-topics-per-connection = 16\n"
      "history-size = 50\n"
      "history-ttl = 60\n"
      "idempotency-window = 1.5\n"
      "history-max-bytes = 1_048_576\n"
      "upgrade-timeout = 0.5\n"
      "close-timeout = 2\n"
      "message-timeout = 3\n"
      "ping-interval = 4\n"
      "pong-timeout = 5\n"
      "drain-seconds = 6.5\n"
      "pool-workers = 2\n"
      "pool-max-workers = 4\n"
      "pool-queue = 64\n");
  config c = parse_file(f);
  CHECK(c.listen == "127.0.0.1:9000");
  CHECK(c.conn.ws_path == "/socket");
  CHECK(c.conn.sse_path == "/events");
  CHECK(c.tls_cert == "cert.pem");
  CHECK(c.tls_key == "key.pem");
  CHECK(c.kernel_tls == kernel_tls_mode::off);
  CHECK(c.admin_listen == "127.0.0.1:9001");
  CHECK(c.api_key == "k3y");
  CHECK(c.max_body_bytes == 2048);
  CHECK(c.mode == app_mode::pubsub);
  CHECK(c.io == io_kind::epoll);
  CHECK(c.threads == 3);
  CHECK(c.auth_none);
  CHECK(c.bus == "rediss://127.0.0.1:6380/2");
  CHECK(c.redis_timeout == 2.5);
  CHECK(c.redis_password_file == password.path);
  CHECK(c.redis_password == "pw");
  CHECK(c.redis_tls.ca == "ca.pem");
  CHECK(c.redis_tls.cert == "rc.pem");
  CHECK(c.redis_tls.key == "rk.pem");
  CHECK(c.redis_wait_replicas == 1);
  CHECK(c.redis_wait_ms == 250);
  CHECK(c.reuseport);
  CHECK(c.conn.max_connections == 100000);
  CHECK(c.conn.max_request_bytes == 4096);
  CHECK(c.conn.max_frame_bytes == 1000);
  CHECK(c.conn.max_message_bytes == 2000);
  CHECK_FALSE(c.conn.compression);
  CHECK(c.conn.compression_min_bytes == 512);
  CHECK(c.conn.max_pending_bytes == 8192);
  CHECK(c.session.allow_client_publish);
  CHECK(c.session.max_topics_per_connection == 16);
  CHECK(c.history_size == 50);
  CHECK(c.history_ttl == 60);
  CHECK(c.idempotency_window == 1.5);
  CHECK(c.history_max_bytes == 1048576);
  CHECK(c.conn.upgrade_timeout == 0.5);
  CHECK(c.conn.close_timeout == 2);
  CHECK(c.conn.message_timeout == 3);
  CHECK(c.conn.ping_interval == 4);
  CHECK(c.conn.pong_timeout == 5);
  CHECK(c.loop.drain_seconds == 6.5);
  CHECK(c.pool_workers == 2);
  CHECK(c.pool_max_workers == 4);
  CHECK(c.pool_queue == 64);

  temp_file secret("from-a-file\n");
  temp_file with_secret("jwt-secret = \"s3cret\"\n");
  CHECK(parse_file(with_secret).jwt_secret == "s3cret");
  temp_file with_secret_file("jwt-secret-file = \"" + secret.path + "\"\n");
  CHECK(parse_file(with_secret_file).jwt_secret == "from-a-file");
  // Numbers may be quoted, and --compression takes on/off too: the text gets the command line's checks.
  temp_file quoted("auth = \"none\"\nmax-connections = \"123\"\nhistory-ttl = \"1.5\"\ncompression = \"off\"\n");
  config q = parse_file(quoted);
  CHECK(q.conn.max_connections == 123);
  CHECK(q.history_ttl == 1.5);
  CHECK_FALSE(q.conn.compression);
  // Comments only: every default.
  temp_file comments("# nothing set\n\n   # auth = \"none\"\n");
  CHECK(parse_file(comments, {"--auth=none"}).listen == config{}.listen);
}

TEST_CASE("config file: each option of --help is taken at its default with its TOML type") {
  // Beyond the list above: an option added later is taken from a file too, a number as a TOML
  // number, a switch as a boolean.
  const std::vector<std::string> names = help_options();
  REQUIRE(names.size() > 40);
  std::set<std::string> seen;
  std::istringstream in(help_text());
  std::string name;
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("  --")) name = line.substr(4, line.find(' ', 4) - 4);
    auto d = line.find("[default: ");
    if (name.empty() || name == "config" || name == "help" || d == std::string::npos || seen.count(name)) continue;
    seen.insert(name);
    std::string value = line.substr(d + 10, line.find(']', d) - d - 10);
    const bool is_switch = line.find("--" + name + "  ") != std::string::npos;
    std::string toml;
    if (is_switch) toml = value;  // true or false
    else if (!value.empty() && value.find_first_not_of("0123456789.") == std::string::npos) toml = value;
    else continue;  // strings: nothing to learn
    INFO(name << " = " << toml);
    temp_file f((name == "auth" ? "" : "auth = \"none\"\n") + name + " = " + toml + "\n");
    config c;
    REQUIRE_NOTHROW(c = parse_file(f));
    CHECK(c.given.at(name).value == toml);
  }
  CHECK(seen.count("max-connections"));
  CHECK(seen.count("reuseport"));
  CHECK(seen.count("history-ttl"));
}

TEST_CASE("config file: an unknown key is refused with the file and its line and column") {
  CHECK_THAT(error_of("auth = \"none\"\n\nmax-conections = 5\n"), Catch::EndsWith(":3:1: unknown option \"max-conections\" (see --help)"));
  CHECK_THAT(error_of("  max_connections = 5\n"),
             Catch::Contains(":1:3: unknown option \"max_connections\"") && Catch::Contains("spelled max-connections"));
  CHECK_THAT(error_of("[redis]\ntimeout = 3\n"), Catch::Contains(":1:2: unknown option \"redis\""));
  CHECK_THAT(error_of("help = true\n"), Catch::Contains(":1:1: unknown option \"help\""));
  CHECK_THAT(error_of("auth = \"none\"\nx = 1\n"), Catch::StartsWith("/tmp/wspush-config-"));
}

TEST_CASE("config file: a bad value gets the command line's message with its position and key") {
  CHECK_THAT(error_of("auth = \"none\"\nmax-connections = \"abc\"\n"),
             Catch::EndsWith(":2:19: max-connections: 'abc' is not a whole number in [0, 100000000]"));
  CHECK_THAT(error_of("auth = \"none\"\nmax-connections = -1\n"), Catch::Contains(":2:19: max-connections: '-1' is not"));
  CHECK_THAT(error_of("auth = \"none\"\nmax-connections = 1.5\n"), Catch::Contains(":2:19: max-connections: '1.5' is not"));
  CHECK_THAT(error_of("history-ttl = 0\n"), Catch::EndsWith(":1:15: history-ttl: '0' is not a number of seconds in (0, 86400]"));
  CHECK_THAT(error_of("mode = \"chat\"\n"), Catch::EndsWith(":1:8: mode: 'chat' is not pubsub, echo or broadcast"));
  CHECK_THAT(error_of("auth = \"token\"\n"), Catch::Contains(":1:8: auth: 'token' is not 'none'"));
  CHECK_THAT(error_of("jwt-secret-file = \"/nonexistent/secret\"\n"),
             Catch::Contains(":1:19: jwt-secret-file: cannot read '/nonexistent/secret'"));
  CHECK_THAT(error_of("bus = \"http://x\"\n"), Catch::Contains(":1:7: bus "));
  // The first bad line of the file is the one named, whatever the keys' order.
  CHECK_THAT(error_of("zzz = 1\naaa = 2\n"), Catch::Contains(":1:1: unknown option \"zzz\""));
}

TEST_CASE("config file: a value of the wrong TOML type is refused with its position and key") {
  CHECK_THAT(error_of("listen = 8080\n"), Catch::EndsWith(":1:10: listen: expected a string (in quotes), got an integer"));
  CHECK_THAT(error_of("reuseport = \"yes\"\n"), Catch::EndsWith(":1:13: reuseport: expected true or false, got a string"));
  CHECK_THAT(error_of("auth = \"none\"\nreuseport = 1\n"), Catch::Contains(":2:13: reuseport: expected true or false"));
  CHECK_THAT(error_of("max-connections = true\n"), Catch::EndsWith(":1:19: max-connections: expected a number, got a boolean"));
  CHECK_THAT(error_of("history-ttl = [1, 2]\n"), Catch::Contains(":1:15: history-ttl: expected a number, got an array"));
  CHECK_THAT(error_of("compression = 1\n"), Catch::Contains(":1:15: compression: expected true or false"));
  CHECK_THAT(error_of("mode = 1979-05-27\n"), Catch::Contains(":1:8: mode: expected a string (in quotes), got a date"));
}

TEST_CASE("config file: a TOML syntax error gives the position and the parser's description") {
  CHECK_THAT(error_of("auth = \"none\"\nmax-connections = 3 4\n"),
             Catch::Contains(":2:21: ") && Catch::Contains("expected a comment or whitespace"));
  CHECK_THAT(error_of("listen = \"127.0.0.1:0\n"), Catch::Contains(":1:") && Catch::Contains("string"));
  CHECK_THAT(error_of("auth = \"none\"\nauth = \"none\"\n"), Catch::Contains(":2:") && Catch::Contains("auth"));
  CHECK_THAT(error_of("= 3\n"), Catch::Contains(":1:1: "));
}

TEST_CASE("config file: the key config is refused in the file") {
  CHECK_THAT(error_of("auth = \"none\"\nconfig = \"/etc/wspush/other.toml\"\n"),
             Catch::Contains(":2:1: config: --config belongs on the command line"));
}

TEST_CASE("config file: one that cannot be read is named") {
  CHECK_THROWS_WITH(parse({"--auth=none", "--config", "/nonexistent/wspush.toml"}),
                    Catch::Contains("--config: cannot read '/nonexistent/wspush.toml'"));
  CHECK_THROWS_WITH(parse({"--auth=none", "--config", "/tmp"}), Catch::Contains("Is a directory"));
}

TEST_CASE("config file: --help lists --config") {
  CHECK_THAT(help_text(), Catch::Contains("--config FILE") && Catch::Contains("SIGHUP"));
  // --help still reads the file: a bad one is refused there too.
  temp_file bad("max-conections = 1\n");
  CHECK_THROWS_WITH(parse_file(bad, {"--help"}), Catch::Contains("unknown option"));
}

/// The lines of config_changes, and which of them are in effect at once.
static std::vector<std::string> lines_of(const std::vector<config_change>& changes,
                                         std::vector<bool>* in_effect = nullptr) {
  std::vector<std::string> out;
  for (const config_change& c : changes) {
    out.push_back(c.line);
    if (in_effect) in_effect->push_back(c.in_effect);
  }
  return out;
}

TEST_CASE("config file: SIGHUP reloads some options, names the others as needing a restart") {
  temp_file f("auth = \"none\"\nmax-connections = 2\nhistory-ttl = 0.5\napi-key = \"one\"\nhistory-size = 5\n");
  scoped_env e("WSPUSH_HISTORY_SIZE", "7");
  const config running = parse_file(f, {"--threads=2"});
  CHECK(config_changes(running, parse_file(f, {"--threads=2"})).empty());
  // The same values written otherwise change nothing.
  f.rewrite("auth = \"none\"\nmax-connections = \"2\"\nhistory-ttl = 0.50\napi-key = \"one\"\nhistory-size = 5\n");
  CHECK(config_changes(running, parse_file(f, {"--threads=2"})).empty());

  f.rewrite("auth = \"none\"\nmax-connections = 5\nhistory-ttl = 0.75\napi-key = \"two\"\nhistory-size = 6\nthreads = 4\n");
  std::vector<bool> now;
  std::vector<std::string> lines = lines_of(config_changes(running, parse_file(f, {"--threads=2"})), &now);
  REQUIRE(lines.size() == 5);  // in the order of --help
  CHECK(lines[0] == f.path + ":4: api-key changed: in effect now");  // secrets are not logged
  CHECK(now[0]);
  CHECK(lines[1] == f.path + ":6: threads changed in the file, but the command line overrides it: nothing to do");
  CHECK_FALSE(now[1]);
  CHECK(lines[2] == f.path + ":2: max-connections changed (2 -> 5): in effect now");
  CHECK(now[2]);
  CHECK(lines[3] == f.path + ":5: history-size changed in the file, but WSPUSH_HISTORY_SIZE overrides it: nothing to do");
  CHECK_FALSE(now[3]);
  CHECK(lines[4] == f.path + ":3: history-ttl changed (0.5 -> 0.75): it needs a restart; 0.5 stays in effect until then");
  CHECK_FALSE(now[4]);
  // A key taken out of the file goes back to its default: a change too.
  f.rewrite("auth = \"none\"\nhistory-ttl = 0.5\napi-key = \"one\"\nhistory-size = 5\n");
  lines = lines_of(config_changes(running, parse_file(f, {"--threads=2"})));
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == f.path + ": max-connections changed (2 -> 0): in effect now");
}

TEST_CASE("config file: which options SIGHUP reloads, and each one's line") {
  for (const char* name : {"api-key", "max-connections", "upgrade-rate", "client-message-rate", "client-message-burst",
                           "log-level"})
    CHECK(is_reloadable(name));
  for (const char* name : {"threads", "listen", "jwt-secret", "history-size", "max-connections-per-user", "bus",
                           "max-connection-lifetime", "config"})
    CHECK_FALSE(is_reloadable(name));
  temp_file f("auth = \"none\"\nupgrade-rate = 100\nclient-message-rate = 10\nclient-message-burst = 5\n"
              "log-level = \"info\"\nping-interval = 20\n");
  const config running = parse_file(f);
  f.rewrite("auth = \"none\"\nupgrade-rate = 3\nclient-message-rate = 2\nclient-message-burst = 1\n"
            "log-level = \"debug\"\nping-interval = 30\n");
  const config next = parse_file(f);
  CHECK(next.logging == log_level::debug);
  std::vector<bool> now;
  const std::vector<std::string> lines = lines_of(config_changes(running, next), &now);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == f.path + ":2: upgrade-rate changed (100 -> 3): in effect now");
  CHECK(lines[1] == f.path + ":3: client-message-rate changed (10 -> 2): in effect now");
  CHECK(lines[2] == f.path + ":4: client-message-burst changed (5 -> 1): in effect now");
  CHECK(lines[3] == f.path + ":6: ping-interval changed (20 -> 30): it needs a restart; 20 stays in effect until then");
  CHECK(lines[4] == f.path + ":5: log-level changed (info -> debug): in effect now");
  CHECK(now == std::vector<bool>{true, true, true, false, true});

  // Once taken in, the reloaded options are no change any more; the restart-only one still is.
  config taken = running;
  take_reloadable(taken, next);
  CHECK(taken.conn.upgrade_rate == 3);
  CHECK(taken.logging == log_level::debug);
  CHECK(taken.conn.ping_interval == 20);
  const std::vector<std::string> again = lines_of(config_changes(taken, next));
  REQUIRE(again.size() == 1);
  CHECK_THAT(again[0], Catch::StartsWith(f.path + ":6: ping-interval changed (20 -> 30): it needs a restart"));
}

TEST_CASE("config file: a reloaded api-key taken in, and one taken out of the file") {
  temp_file f("auth = \"none\"\napi-key = \"one\"\n");
  config running = parse_file(f);
  f.rewrite("auth = \"none\"\napi-key = \"two\"\n");
  const config two = parse_file(f);
  take_reloadable(running, two);
  CHECK(running.api_key == "two");
  CHECK(config_changes(running, two).empty());
  f.rewrite("auth = \"none\"\n");  // no key: the publish endpoints open again
  const config none = parse_file(f);
  const std::vector<std::string> lines = lines_of(config_changes(running, none));
  REQUIRE(lines.size() == 1);
  CHECK(lines[0] == f.path + ": api-key changed: in effect now");
  take_reloadable(running, none);
  CHECK(running.api_key.empty());
  CHECK(config_changes(running, none).empty());
  // An api-key the command line gives wins over the file's, at each SIGHUP too.
  f.rewrite("auth = \"none\"\napi-key = \"three\"\n");
  const config cli = parse_file(f, {"--api-key=cli"});
  CHECK(cli.api_key == "cli");
}

TEST_CASE("config file: --log-level") {
  CHECK(parse({"--auth=none"}).logging == log_level::info);
  CHECK(parse({"--auth=none", "--log-level=warn"}).logging == log_level::warn);
  CHECK(parse({"--auth=none", "--log-level", "error"}).logging == log_level::error);
  CHECK_THROWS_WITH(parse({"--auth=none", "--log-level=verbose"}),
                    Catch::Contains("--log-level: 'verbose' is not error, warn, info or debug"));
  CHECK_THAT(help_text(), Catch::Contains("--log-level error|warn|info|debug") &&
                              Catch::Contains("(SIGHUP reloads it) [default: info]"));
}

TEST_CASE("config file: --presence and --join-leave are switches like every option") {
  CHECK_FALSE(parse({"--auth=none"}).topics.presence);
  CHECK_FALSE(parse({"--auth=none"}).topics.join_leave);
  CHECK(parse({"--auth=none", "--presence"}).topics.presence);
  temp_file f("auth = \"none\"\njoin-leave = true\n");
  CHECK(parse_file(f).topics.join_leave);
  scoped_env e("WSPUSH_PRESENCE", "true");
  CHECK(parse_file(f).topics.presence);
  CHECK_THAT(help_text(), Catch::Contains("--presence") && Catch::Contains("--join-leave") &&
                              Catch::Contains("[namespace.\"mailbox:\"]"));
}

TEST_CASE("config file: the global topic options gather history, compression and client publish") {
  const config c = parse({"--auth=none", "--history-size=7", "--history-ttl=9", "--compression=off"});
  CHECK(c.topics.history_size == 7);
  CHECK(c.topics.history_ttl == 9);
  CHECK_FALSE(c.topics.compression);
  CHECK_FALSE(c.topics.client_publish);  // --auth=none without --allow-client-publish
  CHECK(parse({"--auth=none", "--allow-client-publish"}).topics.client_publish);
  CHECK(parse({"--jwt-secret=s"}).topics.client_publish);  // tokens: their pub claim decides
  CHECK(c.namespaces.empty());
}

TEST_CASE("config file: namespace tables take each key they do not give from the global options") {
  temp_file f(
      "auth = \"none\"\n"
      "history-size = 50\n"
      "presence = true\n"
      "\n"
      "[namespace.\"mailbox:\"]\n"
      "history-size = 20\n"
      "history-ttl = 86400\n"
      "join-leave = false\n"
      "client-publish = false\n"
      "\n"
      "[namespace.\"team:\"]\n"
      "join-leave = true\n"
      "compression = \"off\"\n"
      "client-publish = true\n");
  const config c = parse_file(f, {"--history-ttl=60"});
  REQUIRE(c.namespaces.size() == 2);
  const topic_namespace &mail = c.namespaces[0], &team = c.namespaces[1];
  CHECK(mail.prefix == "mailbox:");
  CHECK(mail.where == f.path + ":5");
  CHECK(mail.options.history_size == 20);
  CHECK(mail.options.history_ttl == 86400);
  CHECK(mail.options.presence);  // the global value
  CHECK_FALSE(mail.options.join_leave);
  CHECK_FALSE(mail.options.client_publish);
  CHECK(mail.options.compression);
  CHECK(team.prefix == "team:");
  CHECK(team.options.history_size == 50);  // the file's global value
  CHECK(team.options.history_ttl == 60);   // the command line's
  CHECK(team.options.join_leave);
  CHECK_FALSE(team.options.compression);
  CHECK(team.options.client_publish);
  CHECK_FALSE(c.topics.client_publish);
}

TEST_CASE("config file: a bad namespace table is refused with its line, column and key") {
  const std::string head = "auth = \"none\"\n";
  CHECK_THAT(error_of(head + "[namespace.\"mailbox:\"]\nhistory-sise = 20\n"),
             Catch::Contains(":3:1: namespace \"mailbox:\": unknown key \"history-sise\"") &&
                 Catch::Contains("history-size, history-ttl, presence, join-leave, client-publish, compression"));
  CHECK_THAT(error_of(head + "[namespace.\"mailbox:\"]\nhistory-size = -1\n"),
             Catch::EndsWith(":3:16: namespace \"mailbox:\": history-size: '-1' is not a whole number in [0, 1000000]"));
  CHECK_THAT(error_of(head + "[namespace.\"mailbox:\"]\nhistory-ttl = 0\n"),
             Catch::Contains(":3:15: namespace \"mailbox:\": history-ttl: '0' is not a number of seconds in (0, 86400]"));
  CHECK_THAT(error_of(head + "[namespace.\"mailbox:\"]\npresence = \"yes\"\n"),
             Catch::Contains(":3:12: namespace \"mailbox:\": presence: expected true or false, got a string"));
  CHECK_THAT(error_of(head + "[namespace.\"mailbox:\"]\ncompression = \"maybe\"\n"),
             Catch::Contains(":3:15: namespace \"mailbox:\": compression: 'maybe' is not a boolean"));
  CHECK_THAT(error_of(head + "[namespace.\"\"]\npresence = true\n"),
             Catch::Contains(":2:12: namespace \"\": the prefix is empty"));
  CHECK_THAT(error_of(head + "[namespace.\"mail box:\"]\npresence = true\n"),
             Catch::Contains(":2:12: namespace \"mail box:\": not a topic prefix"));
  CHECK_THAT(error_of(head + "[namespace.\"mail*\"]\n"), Catch::Contains("namespace \"mail*\": not a topic prefix"));
  CHECK_THAT(error_of(head + "[namespace.\"" + std::string(129, 'a') + "\"]\n"), Catch::Contains("not a topic prefix"));
  CHECK_THAT(error_of(head + "[namespace.\"a:\"]\n[namespace.\"a:\".deeper]\n"),
             Catch::Contains(":3:17: namespace \"a:\": unknown key \"deeper\""));
  CHECK_THAT(error_of(head + "namespace = 3\n"), Catch::Contains(":2:13: namespace: expected tables"));
  CHECK_THAT(error_of(head + "[namespace]\n\"a:\" = 3\n"), Catch::Contains(":3:1: namespace \"a:\": expected a table"));
  // TOML itself refuses a table given twice (any quoting): the message names it, with its place.
  CHECK_THAT(error_of(head + "[namespace.\"a:\"]\npresence = true\n[namespace.'a:']\n"),
             Catch::EndsWith(":4:1: the table [namespace.'a:'] is given twice: a table is written once (a namespace: "
                             "one table per prefix)"));
  CHECK_THAT(error_of(head + "[namespace.\"a:\"]\n\n  [namespace.\"a:\"]  # again\n"),
             Catch::Contains(":4:3: the table [namespace.\"a:\"] is given twice"));
  // Only the file holds them.
  CHECK_THROWS_WITH(parse({"--auth=none", "--namespace=a:"}), Catch::Contains("unknown option --namespace"));
  // Any other table is an unknown option still.
  CHECK_THAT(error_of(head + "[namespaces.\"a:\"]\n"), Catch::Contains("unknown option \"namespaces\""));
}

TEST_CASE("config file: SIGHUP names a namespace added, removed or changed as needing a restart") {
  temp_file f("auth = \"none\"\n[namespace.\"a:\"]\nhistory-size = 5\n[namespace.\"b:\"]\npresence = true\n");
  const config running = parse_file(f);
  CHECK(config_changes(running, parse_file(f)).empty());
  f.rewrite("auth = \"none\"\n[namespace.\"b:\"]\npresence = true\n[namespace.\"a:\"]\nhistory-size = 5\n");
  CHECK(config_changes(running, parse_file(f)).empty());  // the order of the tables is no change
  f.rewrite("auth = \"none\"\n[namespace.\"a:\"]\nhistory-size = 6\n[namespace.\"c:\"]\npresence = true\n");
  const std::vector<std::string> lines = lines_of(config_changes(running, parse_file(f)));
  REQUIRE(lines.size() == 3);
  CHECK(lines[0] == f.path + ":2: namespace \"a:\" changed: it needs a restart; the running one stays in effect until then");
  CHECK(lines[1] == f.path + ": namespace \"b:\" removed: it needs a restart; it stays in effect until then");
  CHECK(lines[2] == f.path + ":4: namespace \"c:\" added: it needs a restart to take effect");
}
