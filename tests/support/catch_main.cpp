// The main of every unit-test binary. A run that names test cases and matches none of them
// fails (exit 2, "No test cases matched ...") instead of passing with "No tests ran": ctest
// runs each case by its name, and a name that does not come back intact from
// catch_discover_tests (a ';' splits it into several entries) must not pass for a case that
// ran. The same as `--warn NoTests` on every command line; a run without names runs every case.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  Catch::Session session;
  auto& data = session.configData();
  data.warnings = static_cast<Catch::WarnAbout::What>(data.warnings | Catch::WarnAbout::NoTests);
  return session.run(argc, argv);
}
