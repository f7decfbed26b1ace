// Command-line parsing with Boost program_options (see cli.hpp).
#include "app/cli.hpp"

#include <boost/program_options.hpp>
#include <sstream>

#include "app/fit_memory.hpp"
#include "util/byte_size.hpp"
#include "util/error.hpp"

namespace po = boost::program_options;

namespace piper {

const char* piper_version() { return "piper 0.1.0"; }

CliOptions parse_cli(int argc, char** argv) {
  CliOptions o;
  po::options_description desc(
      "Usage: piper --config JOB.toml [options]\n"
      "       mpirun -np N piper --config JOB.toml   |   srun piper --config JOB.toml\n"
      "       piper sample CHECKPOINT.h5 --prompt TEXT [options]   (piper sample --help)\n\nOptions");
  desc.add_options()
      ("config,c", po::value<std::string>(&o.config)->value_name("FILE"), "the job file (TOML)")
      ("set", po::value<std::vector<std::string>>(&o.overrides)->composing()->value_name("KEY=VALUE"),
       "override a job key, e.g. --set model.n_layers=4 (repeatable)")
      ("steps", po::value<int64_t>(&o.steps)->value_name("N"), "end the run at step N <= job.steps (past the checkpoint's step when resuming)")
      ("metrics", po::value<std::string>(&o.metrics)->value_name("FILE"), "write one JSON line per step")
      ("resume", po::value<std::string>(&o.resume)->value_name("auto|PATH"),
       "resume from the newest checkpoint in checkpoint.dir (auto) or from PATH")
      ("dry-run", po::bool_switch(&o.dry_run), "compile and verify, print the plans' summary, train nothing")
      ("dump-plan", po::value<std::string>(&o.dump_plan)->value_name("DIR"),
       "write the training graph (text, DOT) and every plan (text) into DIR")
      ("world", po::value<int>(&o.world)->value_name("N"), "with --dry-run: compile for N ranks on one process")
      ("fit-memory", po::value<std::string>(&o.fit_memory)->value_name("SIZE"),
       "with --dry-run: per ZeRO level, the largest microbatch whose estimated peak fits SIZE (e.g. 80GiB) on every rank")
      ("trace", po::value<std::string>(&o.trace)->value_name("FILE"),
       "write a Chrome-trace JSON timeline of the whole job (open it in Perfetto)")
      ("profile", po::bool_switch(&o.profile),
       "time every kernel call (after the first step) and print a breakdown by kernel, model segment and matmul shape")
      ("json", po::bool_switch(&o.json), "with --dry-run: print the report as one JSON document instead of text")
      ("report-json", po::value<std::string>(&o.report_json)->value_name("FILE"),
       "write every rank's end-of-run reports (time, memory, replica check, --profile's tables) as one JSON document")
      ("help,h", po::bool_switch(&o.help), "show this help")
      ("version", po::bool_switch(&o.version), "show the version");
  std::ostringstream help;
  help << desc;
  o.help_text = help.str();
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(argc, argv).options(desc).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(cat("command line: ", e.what(), " (see piper --help)"));
  }
  if (o.help || o.version) return o;
  if (o.config.empty()) throw UserError("command line: --config FILE is required (see piper --help)");
  if (o.steps != -1 && o.steps < 1) throw UserError(cat("command line: --steps must be >= 1, found ", o.steps));
  if (o.world < 0) throw UserError(cat("command line: --world must be >= 1, found ", o.world));
  if (o.world > 0 && !o.dry_run) throw UserError("command line: --world N only works with --dry-run");
  if (!o.fit_memory.empty()) {
    if (!o.dry_run) throw UserError("command line: --fit-memory SIZE only works with --dry-run");
    o.fit_memory_bytes = parse_byte_size(o.fit_memory, "command line: --fit-memory");
  }
  if (o.json && !o.dry_run)
    throw UserError("command line: --json only works with --dry-run (a training run writes its reports as JSON with "
                    "--report-json FILE)");
  if (o.dry_run && !o.report_json.empty())
    throw UserError("command line: --report-json FILE has no effect with --dry-run (--json prints the dry run's report "
                    "as JSON)");
  if (o.dry_run && o.profile) throw UserError("command line: --profile has no effect with --dry-run");
  if (o.dry_run && !o.resume.empty()) throw UserError("command line: --resume has no effect with --dry-run");
  return o;
}

}  // namespace piper
